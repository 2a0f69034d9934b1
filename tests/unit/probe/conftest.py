"""Fixtures of the probe tests (the fakes themselves are in probe_fakes.py)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from probe_fakes import FakeNvml


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch):
    """Install a FakeNvml built by the returned function as ``pynvml``."""

    def install(gpus: list[dict[str, Any]], init: Any = None) -> FakeNvml:
        fake = FakeNvml(gpus, init)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake

    return install
