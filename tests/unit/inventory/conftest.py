"""Inventory unit tests never read the real ~/.ssh/config."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_ssh_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERCTL_SSH_CONFIG", "none")
