"""Static checks that keep the package honest: types, and the layer rule.

mypy runs over the whole package (httpx-style: full annotations are part of
the interface); the core must never import the CLI layer or terminal libraries.
"""

from __future__ import annotations

import ast
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
