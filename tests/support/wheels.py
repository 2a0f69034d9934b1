"""A tiny vLLM stand-in wheel for ``engine install`` tests (unit and lab), written by hand: no build
backend, no network."""

from __future__ import annotations

import base64
import ensurepip
import hashlib
import os
import shutil
import zipfile
from pathlib import Path


def build_wheel(out: Path, version: str = "0.11.0") -> Path:
    """A pure-Python wheel named vllm (module ``vllm``, console script ``vllm --version``), written by hand."""
    files = {
        "vllm/__init__.py": f"__version__ = {version!r}\n",
        "vllm/cli.py": "import sys\nfrom vllm import __version__\n\ndef main():\n"
                       "    if sys.argv[1:] == ['--version']:\n        print(__version__)\n",
        f"vllm-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n",
        f"vllm-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                           "Tag: py3-none-any\n",
        f"vllm-{version}.dist-info/entry_points.txt": "[console_scripts]\nvllm = vllm.cli:main\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    record.append(f"vllm-{version}.dist-info/RECORD,,")
    files[f"vllm-{version}.dist-info/RECORD"] = "\n".join(record) + "\n"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"vllm-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return path


def copy_bundled_pip(out: Path) -> Path:
    """The pip wheel this Python's ensurepip bundles, copied into ``out``: lab hosts have no ensurepip,
    and engine install bootstraps pip from a ``pip-*.whl`` in the wheelhouse."""
    bundled = Path(os.path.dirname(ensurepip.__file__)) / "_bundled"
    [whl] = sorted(bundled.glob("pip-*.whl"))
    return Path(shutil.copy(whl, out))
