"""Every clusterctl module imports cleanly as the first clusterctl module of a fresh interpreter.

An import cycle can hide behind import order: ``a`` imports ``b`` which imports ``a`` works when
``a`` is imported first and fails (``ImportError: cannot import name ... partially initialized
module``) when ``b`` is.  The test suite imports modules in one order only, so a cycle introduced by
moving an import to the top of its module (docs/architecture.md, "What holds";
``INLINE_IMPORTS`` in test_static_checks.py) can pass every other test.  Here each module is imported
in its own process that has loaded no clusterctl module before.

Speed: a fresh ``python3 -c "import clusterctl.x"`` per module costs about a minute on two CPUs.
Instead one server process (that never imports clusterctl) loads the standard and third-party
modules clusterctl imports at the top of its modules, compiles clusterctl's bytecode into a
temporary cache, and then forks one child per clusterctl module: each child starts with no
clusterctl module loaded, so it is as fresh as a new interpreter for the import order that matters.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "clusterctl"

#: The server: reads {"modules": [...], "preload": [...], "jobs": N} on stdin, prints one JSON line
#: {"failed": {module: traceback tail}, "checked": N}.  Standard library only; never imports
#: clusterctl itself (it asserts so before each fork).
_SERVER = r"""
import compileall, importlib, json, os, sys, tempfile, traceback
job = json.load(sys.stdin)
compileall.compile_dir(job["package"], quiet=2)
for name in job["preload"]:
    try:
        importlib.import_module(name)
    except Exception:
        pass  # a module the child then imports itself (or fails on, reported there)
assert not [m for m in sys.modules if m == "clusterctl" or m.startswith("clusterctl.")]
logs = tempfile.mkdtemp(prefix="import-order-")
running, failed = {}, {}

def reap():
    pid, status = os.wait()
    name, log = running.pop(pid)
    if status:
        with open(log) as fh:
            failed[name] = fh.read()[-1500:] or f"exit status {status}"
    os.unlink(log)

for i, name in enumerate(job["modules"]):
    while len(running) >= job["jobs"]:
        reap()
    log = os.path.join(logs, str(i))
    pid = os.fork()
    if pid == 0:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        try:
            importlib.import_module(name)
            code = 0
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    running[pid] = (name, log)
while running:
    reap()
os.rmdir(logs)
print(json.dumps({"failed": failed, "checked": len(job["modules"])}))
"""


def _modules() -> list[str]:
    """Every module of the package, ``__main__`` modules left out (importing one runs it)."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return out


def _preload() -> list[str]:
    """The non-clusterctl modules imported at the top of clusterctl's modules (what every child
    would otherwise load again)."""
    names: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
    return sorted(n for n in names if n.split(".")[0] not in ("clusterctl", "__future__"))


def test_every_module_imports_first_in_a_fresh_interpreter(tmp_path: Path) -> None:
    modules = _modules()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(tmp_path / "pyc")
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE.parent), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    job = {
        "package": str(PACKAGE),
        "modules": modules,
        "preload": _preload(),
        "jobs": max(2, min(4, os.cpu_count() or 2)),
    }
    done = subprocess.run(
        [sys.executable, "-c", _SERVER],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["checked"] == len(modules) > 300
    assert not report["failed"], "\n\n".join(f"import {m} (first):\n{tb}" for m, tb in report["failed"].items())


def test_the_module_list_covers_the_package() -> None:
    """The list holds packages and leaf modules (so a cycle through a package __init__ is seen)."""
    modules = _modules()
    assert {"clusterctl", "clusterctl.cli.main", "clusterctl.deploy", "clusterctl.node.collector"} <= set(modules)
    assert not [m for m in modules if m.endswith("__main__")]
