"""Install the simulator into a lab template root as vLLM installations.

Layout inside the host:

* ``/opt/vllm-sim/lib/vllm_sim/``  the package (stdlib only), importable as ``vllm_sim``
* ``/opt/vllm-0.11/bin/vllm``      launcher emulating vLLM 0.11.0
* ``/opt/vllm-0.33/bin/vllm``      launcher emulating vLLM 0.33.0
* ``/usr/local/bin/vllm``          launcher honouring ``--emulate-version`` / ``$VLLM_SIM_VERSION`` (default 0.11)
* ``/usr/local/bin/vllm-sim``      ``vllm-sim make-model NAME DIR [--sparse]`` on the host

Runs on the control side at template build time (not copied into hosts).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

SRC = Path(__file__).parent
GUEST_LIB = "/opt/vllm-sim/lib"
#: Engine name -> (launcher path in the host, emulated version, full version).
ENGINES = {"vllm-0.11": ("/opt/vllm-0.11/bin/vllm", "0.11", "0.11.0"),
           "vllm-0.33": ("/opt/vllm-0.33/bin/vllm", "0.33", "0.33.0")}
DEFAULT_LAUNCHER = "/usr/local/bin/vllm"
TOOL_LAUNCHER = "/usr/local/bin/vllm-sim"


def sources() -> list[Path]:
    """The package files that go into hosts (what the template hash must cover)."""
    return sorted(p for p in SRC.glob("*.py") if p.name != "install.py")


def _launcher(version: str | None, tool: bool = False) -> str:
    ver = "None" if version is None else repr(version)
    call = "main(['make-model', *sys.argv[1:]]) if len(sys.argv) < 2 or sys.argv[1] != 'make-model' " \
           "else main(sys.argv[1:])" if tool else f"main(version={ver})"
    return ("#!/usr/bin/python3\n"
            f"# vLLM {'(version from --emulate-version or $VLLM_SIM_VERSION)' if version is None else version}"
            " -- clusterctl lab simulator, see docs/vllm-simulator.md\n"
            "import sys\n"
            f"sys.path.insert(0, {GUEST_LIB!r})\n"
            "from vllm_sim.cli import main\n"
            f"sys.exit({call})\n")


def _write(path: Path, text: str, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.lab-tmp")
    tmp.write_text(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def install_into_rootfs(root: Path) -> None:
    """Copy the package and write the launchers into ``root`` (idempotent)."""
    root = Path(root)
    lib = root / GUEST_LIB.lstrip("/") / "vllm_sim"
    if lib.exists():
        shutil.rmtree(lib)
    lib.mkdir(parents=True)
    for src in sources():
        _write(lib / src.name, src.read_text(), 0o644)
    for _name, (path, version, _full) in ENGINES.items():
        _write(root / path.lstrip("/"), _launcher(version), 0o755)
    _write(root / DEFAULT_LAUNCHER.lstrip("/"), _launcher(None), 0o755)
    _write(root / TOOL_LAUNCHER.lstrip("/"), _launcher(None, tool=True), 0o755)
