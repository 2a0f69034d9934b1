"""Inventory unit tests never read the real ~/.ssh/config."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "inventory"
EXAMPLES = Path(__file__).resolve().parents[3] / "inventories"


@pytest.fixture(autouse=True)
def _no_ssh_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERCTL_SSH_CONFIG", "none")
