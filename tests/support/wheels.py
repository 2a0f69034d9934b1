"""A tiny vLLM stand-in wheel for ``engine install`` tests (unit and lab), written by hand: no build
backend, no network."""

from __future__ import annotations

import ensurepip
import os
import shutil
from pathlib import Path

from clusterctl.lab.vllm_sim.install import write_wheel


def build_wheel(out: Path, version: str = "0.11.0", version_body: str = "print(__version__)") -> Path:
    """A pure-Python wheel named vllm (module ``vllm``, console script ``vllm --version`` running
    ``version_body``), written by hand."""
    files = {
        "vllm/__init__.py": f"__version__ = {version!r}\n",
        "vllm/cli.py": "import sys\nimport time\nfrom vllm import __version__\n\ndef main():\n"
        f"    if sys.argv[1:] == ['--version']:\n        {version_body}\n",
    }
    return write_wheel(out, "vllm", version, files, {"vllm": "vllm.cli:main"})


def copy_bundled_pip(out: Path) -> Path:
    """The pip wheel this Python's ensurepip bundles, copied into ``out``: lab hosts have no ensurepip,
    and engine install bootstraps pip from a ``pip-*.whl`` in the wheelhouse."""
    bundled = Path(os.path.dirname(ensurepip.__file__)) / "_bundled"
    [whl] = sorted(bundled.glob("pip-*.whl"))
    return Path(shutil.copy(whl, out))
