"""Simulator fixtures shared with the simulator's own tests (subprocesses on 127.0.0.1)."""

from __future__ import annotations

from unit.vllm_sim.conftest import host, models, nvml_lib, start_sim  # noqa: F401  (fixtures)
