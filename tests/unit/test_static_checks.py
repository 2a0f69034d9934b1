"""Static checks that keep the package honest: types, and the layer rule.

mypy runs over the whole package (httpx-style: full annotations are part of
the interface); the core must never import the CLI layer or terminal libraries.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "clusterctl"


def test_the_package_type_checks(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path), str(PACKAGE)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr


CLI_ONLY = ("typer", "rich", "clusterctl.cli")


def test_core_modules_never_import_the_cli_layer() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "cli" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [f"{path}:{node.lineno}: imports {n}" for n in names
                          if any(n == m or n.startswith(m + ".") for m in CLI_ONLY)]
    assert not offenders, "\n".join(offenders)


def _imported(tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, module)`` of every absolute import in ``tree``, in functions too."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.lineno, node.module)]
    return out


def test_features_never_import_the_workflow_layer() -> None:
    """``clusterctl/ops/`` (the workflows) may import the features; nothing below it imports ``ops``:
    only the CLI and ``ops`` itself do."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        top = path.relative_to(PACKAGE).parts[0]
        if top in ("cli", "ops"):
            continue
        offenders += [f"{path}:{line}: imports {n}" for line, n in _imported(ast.parse(path.read_text()))
                      if n == "clusterctl.ops" or n.startswith("clusterctl.ops.")]
    assert not offenders, "\n".join(offenders)


def test_the_workflow_layer_exists_and_never_imports_the_cli() -> None:
    """The rule above is only worth something while ``ops`` holds the workflows (doctor's, the report run's)."""
    ops = PACKAGE / "ops"
    assert (ops / "doctor.py").is_file()
    offenders = [f"{p}:{line}: imports {n}" for p in sorted(ops.rglob("*.py"))
                 for line, n in _imported(ast.parse(p.read_text()))
                 if any(n == m or n.startswith(m + ".") for m in CLI_ONLY)]
    assert not offenders, "\n".join(offenders)


def _modules() -> list[tuple[Path, str, ast.Module]]:
    """Every module of the package: (path, dotted name, tree)."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        out.append((path, name.removesuffix(".__init__"), ast.parse(path.read_text(), filename=str(path))))
    return out


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def test_no_private_name_is_used_across_modules() -> None:
    """A name starting with ``_`` stays inside its module, and a private module (``cli/_common.py``)
    inside its package: what other modules need is public (no hidden doors between features)."""
    offenders = []
    for path, me, tree in _modules():
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        imported: dict[str, str] = {}  # local name -> the clusterctl module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.startswith("clusterctl"):
                mod_pkg = node.module.rpartition(".")[0]
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    imported[a.asname or a.name] = full
                    if _private(a.name) and full.rpartition(".")[0] != package:
                        offenders.append(f"{path}:{node.lineno}: imports the private {full}")
                if any(_private(p) for p in node.module.split(".")) and not (package + ".").startswith(
                        mod_pkg + "."):
                    offenders.append(f"{path}:{node.lineno}: imports the private module {node.module}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("clusterctl") and a.asname:
                        imported[a.asname] = a.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in imported and _private(node.attr):
                offenders.append(f"{path}:{node.lineno}: uses the private {imported[node.value.id]}.{node.attr}")
    assert not offenders, "\n".join(offenders)


def test_the_package_never_writes_the_environment() -> None:
    """Settings travel as arguments: no module sets, updates or deletes ``os.environ`` for another to
    read (the lab, which prepares the environment of the simulated hosts' programs, aside)."""
    offenders = []
    for path, _, tree in _modules():
        if path.relative_to(PACKAGE).parts[0] == "lab":
            continue
        for node in ast.walk(tree):
            env = None
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                env = next((t for t in targets if isinstance(t, ast.Subscript)
                            and ast.unparse(t.value) == "os.environ"), None)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and ast.unparse(node.func) in ("os.environ.update", "os.environ.setdefault",
                                                   "os.environ.pop", "os.environ.clear", "os.putenv"):
                env = node
            if env is not None:
                offenders.append(f"{path}:{node.lineno}: writes os.environ")
    assert not offenders, "\n".join(offenders)


def test_fleets_are_built_by_the_one_factory() -> None:
    """``Fleet(...)`` is constructed only in ``fleet/`` (``fleet/factory.py``'s make_fleet): one place
    decides fanout, timeouts, the sudo password and host-key policy from the options and the config."""
    offenders = []
    for path, _, tree in _modules():
        if path.relative_to(PACKAGE).parts[0] == "fleet":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "Fleet":
                offenders.append(f"{path}:{node.lineno}: builds a Fleet (use clusterctl.fleet.factory)")
    assert not offenders, "\n".join(offenders)


def test_the_tree_passes_ruff() -> None:
    """ruff's rules of pyproject.toml ([tool.ruff]) hold for the package, tests, benchmarks and scripts."""
    root = PACKAGE.parent
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "clusterctl", "tests",
                           "benchmarks", "scripts"], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


#: Imports a node program may make beyond the standard library, each with its reason.
NODE_IMPORT_EXCEPTIONS = {
    # the probe carries its own pynvml (probe/payload.py) and prefers the node's when it is new enough
    ("clusterctl/node/collector.py", "pynvml"),
}


def test_node_programs_import_only_the_stdlib_and_the_node_package() -> None:
    """``clusterctl/node/`` runs on the nodes' own python3: standard library, relative imports
    within the package and ``clusterctl.node`` only (tests/unit/node runs them on Python 3.8)."""
    node_dir = PACKAGE / "node"
    assert (node_dir / "collector.py").is_file()
    offenders = []
    for path in sorted(node_dir.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE.parent))
        for line, n in _imported(ast.parse(path.read_text())):
            top = n.split(".")[0]
            if top in sys.stdlib_module_names or n == "clusterctl.node" or n.startswith("clusterctl.node.") \
                    or (rel, n) in NODE_IMPORT_EXCEPTIONS:
                continue
            offenders.append(f"{path}:{line}: imports {n}")
    assert not offenders, "\n".join(offenders)


def test_node_programs_live_in_the_node_package() -> None:
    """Code shipped to the nodes is read through ``clusterctl.node.source``/``path`` only: no module
    elsewhere reads a sibling ``.py`` file to ship it."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] in ("node", "lab"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and re.fullmatch(r"\w+\.py", node.value) and node.value != "__init__.py":
                offenders.append(f"{path}:{node.lineno}: names the program file {node.value!r}")
    assert not offenders, "\n".join(offenders)


def test_one_class_per_name_for_the_shared_vocabulary() -> None:
    """``Problem`` (a located configuration problem, ``errors.py``) and ``Finding`` are defined once:
    other kinds of problem carry their own name (``PreflightProblem``, ``NicProblem``)."""
    where: dict[str, list[str]] = {"Problem": [], "Finding": []}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name in where:
                where[node.name].append(str(path.relative_to(PACKAGE.parent)))
    assert where == {"Problem": ["clusterctl/errors.py"], "Finding": ["clusterctl/diagnose/findings.py"]}, where
