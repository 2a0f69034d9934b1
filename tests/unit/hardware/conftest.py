"""Fixtures for the simulated-hardware tests: built libraries, provisioned hosts, runners.

Everything runs on the control machine without root: the fake NVML library is
loaded by the real nvidia-ml-py in a subprocess (``LD_LIBRARY_PATH`` +
``FAKE_NVML_STATE``), the fake tools run as scripts with ``LAB_HW_DIR``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from clusterctl.lab.hardware import nvml, provision_host
from clusterctl.lab.hardware.host import hw_dir
from clusterctl.lab.hardware.tools import nicmodel

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hardware"
TOOLS = Path(nicmodel.__file__).parent


@pytest.fixture(scope="session")
def nvml_libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both variants of the fake library, compiled once per test run."""
    out = tmp_path_factory.mktemp("nvml")
    return {v: nvml.build(out, v).parent for v in nvml.VARIANTS}


@pytest.fixture
def make_host(tmp_path: Path) -> Callable[..., Path]:
    """Provision a host dir under tmp_path; returns the host dir."""

    def make(
        name: str = "lab01", index: int = 0, gpus: int = 8, model: str = "H100-SXM5-80GB", flavour: str = "mlnx"
    ) -> Path:
        d = tmp_path / name
        provision_host(d, name, index, gpus, model, flavour)
        (d / "upper").mkdir(exist_ok=True)
        return d

    return make


@pytest.fixture
def pynvml_run(nvml_libs: dict[str, Path]) -> Callable[..., Any]:
    """Run ``code`` with the real pynvml against a fake library; returns ``result`` as JSON.

    ``code`` sees ``N`` (pynvml) and must assign ``result``.
    """

    def run(host_dir: Path, code: str, variant: str = "current") -> Any:
        script = "import json, pynvml as N\n" + textwrap.dedent(code) + "\nprint(json.dumps(result))\n"
        env = dict(
            os.environ, LD_LIBRARY_PATH=str(nvml_libs[variant]), FAKE_NVML_STATE=str(hw_dir(host_dir) / "nvml.json")
        )
        cp = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
        assert cp.returncode == 0, cp.stderr
        return json.loads(cp.stdout.strip().splitlines()[-1])

    return run


@pytest.fixture
def tool() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run a fake tool (``ethtool``, ``mlnx_qos``...) against a host's state."""

    def run(host_dir: Path, name: str, *args: str) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, LAB_HW_DIR=str(hw_dir(host_dir)))
        return subprocess.run(
            [sys.executable, str(TOOLS / f"{name}.py"), *args], env=env, capture_output=True, text=True, timeout=30
        )

    return run


def freeze(host_dir: Path) -> None:
    """Stop every counter (rate 0) at its provisioning value, so outputs are exact."""
    path = hw_dir(host_dir) / "nic.json"
    state = json.loads(path.read_text())
    for nic in state["nics"].values():
        for name, entry in nic["counters"].items():
            nic["counters"][name] = [entry[0], 0.0, entry[2]]
    nicmodel.save(state, str(path))


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()
