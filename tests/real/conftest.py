"""Tier 4: the real vLLM CPU engine (0.32) beside the simulator (0.11, 0.33).

The engine and the tiny real model come from ``scripts/install-real-vllm``
(cached); when they are missing these fixtures fail, never skip.  Every engine
runs on 127.0.0.1; the real one pinned to one core (tests/support/engines.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterctl.lab import realmodel, realvllm
from clusterctl.lab.hardware import nvml, provision_host
from clusterctl.lab.hardware.host import hw_dir
from support.engines import READY, EngineProc, start_engine

KINDS = ("sim-0.11", "sim-0.33", "real-0.32")
KEY = "conformance-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_LEN = 2048
#: The real served engine's KV cache: 96 blocks of 128 tokens (the CPU backend's block size), 6x 2048
#: tokens; vLLM prints it as 0.01 GiB.
SMALL_KV = 12 * 2**20
#: The simulator with the same KV cache as the real CPU engine (same size, same block size, its profile).
SIM_SMALL_KV = (
    "--kv-cache-memory-bytes",
    str(SMALL_KV),
    "--block-size",
    "128",
    "--sim-profile",
    "cpu-1core",
    "--enforce-eager",
)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    eng = realvllm.installed()
    model = realmodel.model_dir()
    assert eng is not None and model is not None, (
        "the real vLLM engine / tiny model are not installed: run scripts/install-real-vllm"
    )
    return model


@pytest.fixture(scope="session")
def fake_host(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(fake libnvidia-ml dir, nvml.json of a host with one idle H100) for the simulator."""
    lib = nvml.build(tmp_path_factory.mktemp("nvml"), "current").parent
    root = tmp_path_factory.mktemp("host")
    provision_host(root / "h1", "h1", 0, 1, "H100-SXM5-80GB", "mlnx")
    return lib, hw_dir(root / "h1") / "nvml.json"


@pytest.fixture
def launch(tiny_model: Path, fake_host: tuple[Path, Path]) -> Iterator:
    """``launch(kind, *flags, env=None, kv_bytes=...)``: an engine on the tiny model; all killed after."""
    started: list[EngineProc] = []

    def go(kind: str, *flags: str, env: dict[str, str] | None = None, **kw: object) -> EngineProc:
        ep = start_engine(kind, tiny_model, *flags, env=env, nvml_lib=fake_host[0], nvml_state=fake_host[1], **kw)  # type: ignore[arg-type]
        started.append(ep)
        return ep

    yield go
    for ep in started:
        ep.kill()


@pytest.fixture(scope="module", params=KINDS)
def served(request: pytest.FixtureRequest, tiny_model: Path, fake_host: tuple[Path, Path]) -> Iterator[EngineProc]:
    """One serving engine of each kind for the module: tiny model as ``tiny``, an API key,
    ``--max-model-len 2048``; the real one with a small KV cache (:data:`SMALL_KV`, so that the preemption
    test can run it out) and a stats line every second."""
    kind = request.param
    ep = start_engine(
        kind,
        tiny_model,
        "--served-model-name",
        "tiny",
        "--max-model-len",
        str(MAX_LEN),
        env={"VLLM_API_KEY": KEY, "VLLM_LOG_STATS_INTERVAL": "1"},
        nvml_lib=fake_host[0],
        nvml_state=fake_host[1],
        kv_bytes=str(SMALL_KV),
    )
    try:
        assert ep.wait_for(READY, 240), ep.log[-4000:]
        yield ep
    finally:
        ep.kill()
