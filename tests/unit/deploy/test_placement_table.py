"""Placement scenarios as data: a fleet, what was recorded, what changed, and where every replica must be.

Each case: ``hosts`` (name -> GPU count), ``templates`` (name, replicas, tp, pattern, port_base),
``instances`` (name -> host, GPUs, port), ``cordons``, optional ``before`` (a first placement run
with other templates/hosts, whose state the second run starts from), ``scale`` (overrides), and
``expect`` (replica -> (host, GPUs, port)) plus ``unplaced`` names.
"""

from __future__ import annotations

from typing import Any

import pytest

from clusterctl.deploy.placement.place import desired_instances
from clusterctl.deploy.state import DeployState

from .placement_helpers import cordoned, inventory, where

CASES: list[dict[str, Any]] = [
    {
        "id": "tp2-over-two-hosts-spreads-then-packs",
        "hosts": {"a": 4, "b": 4},
        "templates": [("p", 4, 2, "a,b", 8000)],
        "expect": {
            "p-1": ("a", (0, 1), 8000),
            "p-2": ("b", (0, 1), 8000),
            "p-3": ("a", (2, 3), 8001),
            "p-4": ("b", (2, 3), 8001),
        },
    },
    {
        "id": "explicit-instance-gpus-and-port-skipped",
        "hosts": {"a": 4},
        "templates": [("p", 2, 1, "a", 8000)],
        "instances": {"x": ("a", [0], 8001)},
        "expect": {"x": ("a", (0,), 8001), "p-1": ("a", (1,), 8000), "p-2": ("a", (2,), 8002)},
    },
    {
        "id": "cordoned-gpu-splits-nothing",
        "hosts": {"a": 4},
        "templates": [("p", 1, 2, "a", 8000)],
        "cordons": ["a:1"],
        "expect": {"p-1": ("a", (2, 3), 8000)},
    },
    {
        "id": "cordoned-host-skipped",
        "hosts": {"a": 2, "b": 2},
        "templates": [("p", 2, 1, "a,b", 8000)],
        "cordons": ["a"],
        "expect": {"p-1": ("b", (0,), 8000), "p-2": ("b", (1,), 8001)},
    },
    {
        "id": "no-room-is-unplaced",
        "hosts": {"a": 3},
        "templates": [("p", 2, 2, "a", 8000)],
        "expect": {"p-1": ("a", (0, 1), 8000)},
        "unplaced": ["p-2"],
    },
    {
        "id": "added-host-moves-nothing",
        "before": {"hosts": {"a": 4}, "templates": [("p", 2, 2, "a", 8000)]},
        "hosts": {"a": 4, "b": 4},
        "templates": [("p", 2, 2, "a,b", 8000)],
        "expect": {"p-1": ("a", (0, 1), 8000), "p-2": ("a", (2, 3), 8001)},
    },
    {
        "id": "scale-up-fills-the-new-host-first",
        "before": {"hosts": {"a": 4}, "templates": [("p", 2, 2, "a", 8000)]},
        "hosts": {"a": 4, "b": 4},
        "templates": [("p", 2, 2, "a,b", 8000)],
        "scale": {"p": 3},
        "expect": {"p-1": ("a", (0, 1), 8000), "p-2": ("a", (2, 3), 8001), "p-3": ("b", (0, 1), 8000)},
    },
    {
        "id": "scale-down-keeps-the-lowest-numbers",
        "before": {"hosts": {"a": 8}, "templates": [("p", 4, 2, "a", 8000)]},
        "hosts": {"a": 8},
        "templates": [("p", 4, 2, "a", 8000)],
        "scale": {"p": 2},
        "expect": {"p-1": ("a", (0, 1), 8000), "p-2": ("a", (2, 3), 8001)},
    },
    {
        "id": "a-cordon-after-placement-moves-nothing",
        "before": {"hosts": {"a": 4}, "templates": [("p", 2, 2, "a", 8000)]},
        "hosts": {"a": 4},
        "templates": [("p", 2, 2, "a", 8000)],
        "cordons": ["a"],
        "expect": {"p-1": ("a", (0, 1), 8000), "p-2": ("a", (2, 3), 8001)},
    },
    {
        "id": "another-templates-recorded-replicas-are-not-free",
        "before": {"hosts": {"a": 4}, "templates": [("q", 1, 2, "a", 8100)]},
        "hosts": {"a": 4},
        "templates": [("p", 2, 2, "a", 8000), ("q", 1, 2, "a", 8100)],
        "expect": {"q-1": ("a", (0, 1), 8100), "p-1": ("a", (2, 3), 8000)},
        "unplaced": ["p-2"],
    },
]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_placement_scenario(case: dict[str, Any]) -> None:
    state = DeployState()
    if "before" in case:
        b = case["before"]
        state = desired_instances(inventory(b["hosts"], b["templates"]), DeployState()).state
    state = cordoned(*case.get("cordons", []), state=state)
    state.replicas.update(case.get("scale", {}))
    res = desired_instances(inventory(case["hosts"], case["templates"], case.get("instances")), state)
    assert where(res) == case["expect"]
    assert sorted(res.unplaced) == sorted(case.get("unplaced", []))
    assert set(res.state.cordons) == set(case.get("cordons", []))
