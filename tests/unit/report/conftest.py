"""Simulator fixtures shared with the simulator's own tests (subprocesses on 127.0.0.1).

This directory is not a package (its tests import ``report_findings`` by name), so
``tests/unit`` is not on ``sys.path`` when it runs alone: add it to reach ``vllm_sim.conftest``.
"""

from __future__ import annotations

import sys
from pathlib import Path

_UNIT = str(Path(__file__).resolve().parents[1])
if _UNIT not in sys.path:
    sys.path.append(_UNIT)

from vllm_sim.conftest import host, models, nvml_lib, start_sim  # noqa: E402,F401  (fixtures)
