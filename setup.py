"""Build hook: the top-level ``checks/`` directory ships inside the package.

``checks/`` stays at the top of the repository (operators read and edit it
there); a built wheel carries a copy as ``clusterctl/_checks/`` so that an
installed ``clusterctl`` has its thresholds and XID catalogue
(``clusterctl/diagnose/thresholds.py`` looks there).  Everything else is in
``pyproject.toml``.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

CHECKS = Path(__file__).resolve().parent / "checks"


class BuildPyWithChecks(build_py):
    def run(self) -> None:
        super().run()
        if not (CHECKS / "xid.yaml").is_file():
            raise SystemExit("setup.py: checks/xid.yaml is missing: refusing to build a package without its check data")
        target = Path(self.build_lib) / "clusterctl" / "_checks"
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(CHECKS, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))


setup(cmdclass={"build_py": BuildPyWithChecks})
