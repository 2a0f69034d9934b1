"""Test tiers: tests/unit (tier 1), tests/lab (tier 2), tests/e2e (tier 3).

Each test is marked after the directory it lives in, so `pytest -m unit` runs
tier 1 alone.  Lab and e2e tests need root and the lab template.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TIERS = ("unit", "lab", "e2e")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).parent
    for item in items:
        try:
            tier = Path(str(item.fspath)).relative_to(root).parts[0]
        except ValueError:
            continue
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
