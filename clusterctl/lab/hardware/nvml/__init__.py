"""Build the fake ``libnvidia-ml.so.1`` (``fake_nvml.c``) with the system C compiler.

Two variants are built from the one source: ``current`` (an R550-like driver)
and ``old`` (R470-like: no ``nvmlDeviceGetComputeRunningProcesses_v3``,
``nvmlDeviceGetMemoryInfo_v2``, ``nvmlDeviceGetCurrentClocksEventReasons`` or
``nvmlDeviceGetNumaNodeId``), so callers' fallbacks run against the old one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from clusterctl.errors import LabError

SOURCE = Path(__file__).with_name("fake_nvml.c")
VARIANTS = ("current", "old")
SONAME = "libnvidia-ml.so.1"

#: Seconds a compile may take before it is reported as failed.
COMPILE_TIMEOUT_S = 120.0


def build(out_dir: Path, variant: str = "current", cc: str | None = None) -> Path:
    """Compile one variant into ``out_dir/<variant>/libnvidia-ml.so.1`` and return its path.

    The file is written under a temporary name and renamed into place, so a
    concurrent reader never loads a half-written library.  Raises
    :class:`LabError` when the compiler is missing or fails (its stderr is
    included).
    """
    if variant not in VARIANTS:
        raise LabError(f"unknown fake NVML variant {variant!r} (known: {', '.join(VARIANTS)})")
    compiler = cc or os.environ.get("CC") or "gcc"
    if shutil.which(compiler) is None:
        raise LabError(f"{compiler}: C compiler not found; install gcc to build the fake NVML library")
    dest_dir = out_dir / variant
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / SONAME
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=dest_dir)
    os.close(fd)
    argv = [
        compiler,
        "-shared",
        "-fPIC",
        "-O2",
        "-Wall",
        "-Wextra",
        "-Wno-unused-parameter",
        "-fvisibility=hidden",
        f"-Wl,-soname,{SONAME}",
        "-o",
        tmp,
        str(SOURCE),
        "-lpthread",
    ]
    if variant == "old":
        argv.insert(1, "-DFAKE_NVML_OLD_DRIVER")
    try:
        cp = subprocess.run(argv, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        os.unlink(tmp)
        raise LabError(f"compiling {SOURCE.name} took longer than {COMPILE_TIMEOUT_S:.0f} s") from e
    if cp.returncode != 0:
        os.unlink(tmp)
        raise LabError(f"compiling {SOURCE.name} failed (rc {cp.returncode}):\n{cp.stderr.strip()}")
    os.chmod(tmp, 0o755)
    os.replace(tmp, dest)
    return dest
