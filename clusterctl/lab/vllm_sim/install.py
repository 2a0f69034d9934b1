"""Install the simulator into a lab template root as vLLM installations.

Layout inside the host:

* ``/opt/vllm-sim/lib/vllm_sim/``  the package (stdlib only), importable as ``vllm_sim``
* ``/opt/vllm-0.11/bin/vllm``      launcher emulating vLLM 0.11.0
* ``/opt/vllm-0.33/bin/vllm``      launcher emulating vLLM 0.33.0
* ``/usr/local/bin/vllm``          launcher honouring ``--emulate-version`` / ``$VLLM_SIM_VERSION`` (default 0.11)
* ``/usr/local/bin/vllm-sim``      ``vllm-sim make-model NAME DIR [--sparse]`` on the host

Runs on the control side at template build time (not copied into hosts).

:func:`build_wheel` packs the simulator as a pip wheel named ``vllm`` (the ``vllm_sim``
package, a ``vllm`` package recording the version, console script ``vllm``), so
``clusterctl engine install --wheels`` can install it as an engine: the lab cannot hold
the real CPU build on every host (docs/bring-up.md).
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import zipfile
from pathlib import Path

SRC = Path(__file__).parent
GUEST_LIB = "/opt/vllm-sim/lib"
#: Engine name -> (launcher path in the host, emulated version, full version).
ENGINES = {
    "vllm-0.11": ("/opt/vllm-0.11/bin/vllm", "0.11", "0.11.0"),
    "vllm-0.33": ("/opt/vllm-0.33/bin/vllm", "0.33", "0.33.0"),
}
DEFAULT_LAUNCHER = "/usr/local/bin/vllm"
TOOL_LAUNCHER = "/usr/local/bin/vllm-sim"


def sources() -> list[Path]:
    """The package files that go into hosts (what the template hash must cover)."""
    return sorted(p for p in SRC.glob("*.py") if p.name != "install.py")


def _launcher(version: str | None, tool: bool = False) -> str:
    ver = "None" if version is None else repr(version)
    call = (
        "main(['make-model', *sys.argv[1:]]) if len(sys.argv) < 2 or sys.argv[1] != 'make-model' "
        "else main(sys.argv[1:])"
        if tool
        else f"main(version={ver})"
    )
    return (
        "#!/usr/bin/python3\n"
        f"# vLLM {'(version from --emulate-version or $VLLM_SIM_VERSION)' if version is None else version}"
        " -- clusterctl lab simulator, see docs/vllm-simulator.md\n"
        "import sys\n"
        f"sys.path.insert(0, {GUEST_LIB!r})\n"
        "from vllm_sim.cli import main\n"
        f"sys.exit({call})\n"
    )


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


def write_wheel(out: Path, name: str, version: str, files: dict[str, str], scripts: dict[str, str]) -> Path:
    """A pure-Python wheel ``NAME-VERSION-py3-none-any.whl`` in ``out`` holding ``files`` (path -> text) and
    console ``scripts`` (name -> ``module:function``), its METADATA, WHEEL, entry points and RECORD written
    by hand: no build backend, no network."""
    info = f"{name}-{version}.dist-info"
    files = dict(files)
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    files[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: clusterctl\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    if scripts:
        files[f"{info}/entry_points.txt"] = "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())
    record = []
    for member, text in files.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{member},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-{version}-py3-none-any.whl"
    tmp = path.with_name(f".{path.name}.tmp")
    with zipfile.ZipFile(tmp, "w") as z:
        for p, text in files.items():
            z.writestr(p, text)
    os.replace(tmp, path)
    return path


def build_wheel(out: Path, version: str = "0.11.0", emulate: str = "0.11") -> Path:
    """The simulator as the wheel ``vllm-VERSION`` (emulating vLLM ``emulate``): ``vllm serve`` and
    ``vllm --version`` work from the virtualenv pip installs it into (stdlib only)."""
    files = {f"vllm_sim/{src.name}": src.read_text() for src in sources()}
    files["vllm/__init__.py"] = (
        f"# the clusterctl lab simulator packaged as vLLM {version} (docs/vllm-simulator.md)\n"
        f"__version__ = {version!r}\n"
    )
    files["vllm/simcli.py"] = (
        "import sys\n\nfrom vllm_sim.cli import main as _main\n\n\n"
        f"def main():\n    sys.exit(_main(version={emulate!r}))\n"
    )
    return write_wheel(Path(out), "vllm", version, files, {"vllm": "vllm.simcli:main"})
