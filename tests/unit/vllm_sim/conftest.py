"""Fixtures for the vLLM simulator: a fake-NVML host, synthetic models, a running simulator.

Everything runs on the control machine without root: the simulator is a
subprocess (``python3 -m clusterctl.lab.vllm_sim serve``) with
``LD_LIBRARY_PATH`` pointing at the fake ``libnvidia-ml.so.1`` and
``FAKE_NVML_STATE`` at a provisioned host's ``nvml.json``; ``--time-scale 0``
removes the simulated delays.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from clusterctl.lab.hardware import nvml, provision_host
from clusterctl.lab.hardware.host import hw_dir
from clusterctl.lab.vllm_sim import synth
from clusterctl.lab.vllm_sim.serve import free_port

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "vllm"
READY = "Application startup complete."


@pytest.fixture(scope="session")
def nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return nvml.build(tmp_path_factory.mktemp("nvml"), "current").parent


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Sparse Qwen3-8B, Qwen3-32B, Llama-3-70B and a real-byte tiny model (written once)."""
    root = tmp_path_factory.mktemp("models")
    out = {}
    for name, sparse in (("qwen3-8b", True), ("qwen3-32b", True), ("llama-3-70b", True), ("tiny", False)):
        synth.write_model(name, root / name, sparse=sparse)
        out[name] = root / name
    return out


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """A host dir with 2 idle H100s; returns the path of its nvml.json."""
    provision_host(tmp_path / "lab01", "lab01", 0, 2, "H100-SXM5-80GB", "mlnx")
    return hw_dir(tmp_path / "lab01") / "nvml.json"


@dataclass
class Sim:
    proc: subprocess.Popen[str]
    port: int
    lines: list[str] = field(default_factory=list)
    _reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, timeout: float = 30.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if text in self.log:
                return True
            if self.proc.poll() is not None and (self._reader is None or not self._reader.is_alive()):
                return text in self.log
            time.sleep(0.02)
        return False

    def wait(self, timeout: float = 30.0) -> int:
        rc = self.proc.wait(timeout)
        if self._reader:
            self._reader.join(5)
        return rc

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait()

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()


@pytest.fixture
def start_sim(nvml_lib: Path) -> Iterator[Callable[..., Sim]]:
    """Start the simulator: ``start_sim(state, model, *flags, gpus="0", env={}, port=None)``.

    ``scale`` is the simulator's time scale (``$VLLM_SIM_TIME_SCALE``); ``startup``, when given, the scale of
    its start-up delays alone (``$VLLM_SIM_STARTUP_SCALE``): ``startup="0"`` for a test about serving at a
    slow scale, not about starting (the qwen3-8b start-up is ~45 s simulated: ~11 s of CI at scale 0.25)."""
    started: list[Sim] = []

    def start(
        state: Path,
        model: Path,
        *flags: str,
        gpus: str | None = "0",
        env: dict[str, str] | None = None,
        port: int | None = None,
        version: str = "0.11",
        scale: str = "0",
        startup: str | None = None,
    ) -> Sim:
        port = port or free_port()
        e = dict(
            os.environ,
            LD_LIBRARY_PATH=str(nvml_lib),
            FAKE_NVML_STATE=str(state),
            VLLM_SIM_VERSION=version,
            VLLM_SIM_TIME_SCALE=scale,
            **({} if startup is None else {"VLLM_SIM_STARTUP_SCALE": startup}),
            **(env or {}),
        )
        e.pop("VLLM_API_KEY", None) if "VLLM_API_KEY" not in (env or {}) else None
        if gpus is None:
            e.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            e["CUDA_VISIBLE_DEVICES"] = gpus
        argv = [
            sys.executable,
            "-m",
            "clusterctl.lab.vllm_sim",
            "serve",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *flags,
        ]
        proc = subprocess.Popen(argv, env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        sim = Sim(proc, port)

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                sim.lines.append(line)

        sim._reader = threading.Thread(target=read, daemon=True)
        sim._reader.start()
        started.append(sim)
        return sim

    yield start
    for sim in started:
        if sim.proc.poll() is None:
            sim.proc.kill()
            sim.proc.wait(10)


def gpu_processes(state: Path) -> dict[int, list[dict[str, Any]]]:
    doc = json.loads(state.read_text())
    return {g["index"]: g["processes"] for g in doc["gpus"]}
