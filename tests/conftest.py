"""Test tiers: tests/unit (tier 1), tests/lab (tier 2), tests/e2e (tier 3), tests/real (tier 4).

Each test is marked after the directory it lives in, so `pytest -m unit` runs
tier 1 alone.  Lab and e2e tests need root and share one lab, brought up once
per pytest run; the terminal summary prints each tier's count and duration.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest

from support.lab_fixture import healed_hosts, lab  # noqa: F401  (fixtures for tiers 2 and 3)

TIERS = ("unit", "lab", "e2e", "real")
_ROOT = Path(__file__).parent
_tier_seconds: dict[str, float] = defaultdict(float)
_tier_counts: dict[str, int] = defaultdict(int)


def _tier_of(path: str) -> str | None:
    try:
        tier = Path(path).relative_to(_ROOT).parts[0]
    except ValueError:
        return None
    return tier if tier in TIERS else None


def pytest_configure(config: pytest.Config) -> None:
    # Programs run "on a node" by a local shell cache themselves here, not in root's home
    # (clusterctl.fleet.cached); nodes reached over SSH never see this variable.
    if "CLUSTERCTL_NODE_CACHE_DIR" not in os.environ:
        os.environ["CLUSTERCTL_NODE_CACHE_DIR"] = tempfile.mkdtemp(prefix="clusterctl-node-cache-") + "/programs"
        config._clusterctl_node_cache = os.path.dirname(os.environ["CLUSTERCTL_NODE_CACHE_DIR"])  # type: ignore[attr-defined]


def pytest_unconfigure(config: pytest.Config) -> None:
    made = getattr(config, "_clusterctl_node_cache", None)
    if made:
        shutil.rmtree(made, ignore_errors=True)
        os.environ.pop("CLUSTERCTL_NODE_CACHE_DIR", None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = _tier_of(str(item.fspath))
        if tier:
            item.add_marker(getattr(pytest.mark, tier))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tier = _tier_of(str(_ROOT.parent / report.location[0]))
    if tier is None:
        return
    _tier_seconds[tier] += report.duration
    if report.when == "call":
        _tier_counts[tier] += 1


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if not _tier_counts:
        return
    terminalreporter.section("durations per tier (setup + call + teardown)")
    for tier in TIERS:
        if _tier_counts.get(tier):
            terminalreporter.write_line(f"tier {tier:5s} {_tier_counts[tier]:4d} tests {_tier_seconds[tier]:8.1f} s")
