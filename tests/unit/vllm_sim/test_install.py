"""The launchers the lab template gets, run as on a lab host: stdlib only (python3 -S)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from clusterctl.lab.vllm_sim import install, synth
from clusterctl.lab.vllm_sim.serve import free_port

from .conftest import READY


def _env(root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VLLM_SIM_VERSION")}
    return dict(env, PYTHONPATH=str(root / install.GUEST_LIB.lstrip("/")), **extra)


def test_launchers_fix_or_choose_the_version(tmp_path: Path) -> None:
    install.install_into_rootfs(tmp_path)
    install.install_into_rootfs(tmp_path)  # idempotent

    def version(launcher: str, **env: str) -> str:
        cp = subprocess.run(
            [sys.executable, "-S", str(tmp_path / launcher.lstrip("/")), "--version"],
            env=_env(tmp_path, **env),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert cp.returncode == 0, cp.stderr
        return cp.stdout.strip()

    assert version("/opt/vllm-0.11/bin/vllm") == "0.11.0"
    assert version("/opt/vllm-0.33/bin/vllm") == "0.33.0"
    assert version("/opt/vllm-0.11/bin/vllm", VLLM_SIM_VERSION="0.33") == "0.11.0"
    assert version("/usr/local/bin/vllm") == "0.11.0"
    assert version("/usr/local/bin/vllm", VLLM_SIM_VERSION="0.33") == "0.33.0"
    assert os.access(tmp_path / "opt/vllm-0.33/bin/vllm", os.X_OK)
    assert not (tmp_path / "opt/vllm-sim/lib/vllm_sim/install.py").exists()


def test_installed_copy_serves_without_site_packages(tmp_path: Path, host: Path, nvml_lib: Path) -> None:
    install.install_into_rootfs(tmp_path / "root")
    synth.write_model("tiny", tmp_path / "m")
    port = free_port()
    env = _env(
        tmp_path / "root",
        LD_LIBRARY_PATH=str(nvml_lib),
        FAKE_NVML_STATE=str(host),
        CUDA_VISIBLE_DEVICES="0",
        VLLM_SIM_TIME_SCALE="0",
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-S",
            str(tmp_path / "root/opt/vllm-0.33/bin/vllm"),
            "serve",
            str(tmp_path / "m"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        out = ""
        for line in proc.stdout:
            out += line
            if READY in line or "Traceback" in line:
                break
        assert READY in out, out
        assert "site-packages/vllm" not in out
    finally:
        proc.terminate()
        proc.wait(10)
    synth_cli = subprocess.run(
        [sys.executable, "-S", str(tmp_path / "root/usr/local/bin/vllm-sim"), "tiny", str(tmp_path / "m2")],
        env=_env(tmp_path / "root"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert synth_cli.returncode == 0, synth_cli.stderr
    assert (tmp_path / "m2/model.safetensors").is_file()
