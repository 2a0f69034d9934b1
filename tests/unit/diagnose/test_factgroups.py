"""Typed fact groups at the analyzer seam (clusterctl/probe/factgroups.py)."""

from __future__ import annotations

import ast
from pathlib import Path

from clusterctl.diagnose.registry import AnalysisContext
from clusterctl.probe.factgroups import GpusFact

REPO = Path(__file__).resolve().parents[3]

DOC = {
    "gpus": {
        "available": True,
        "reason": None,
        "driver_version": "550.54.15",
        "timed_out_calls": [],
        "fabric_manager": {"load_state": "loaded", "active_state": "failed", "sub_state": "failed"},
        "topology": [{"gpus": [0, 1], "nvlinks": 18}, {"gpus": [0, 1]}, "junk"],
        "devices": [
            {
                "index": 0,
                "name": "NVIDIA H100 80GB HBM3",
                "pci_address": "0000:1b:00.0",
                "memory_total": 85899345920,
                "lost": False,
                "hung": False,
                "field_errors": {"power_w": "not supported"},
                "ecc": {"enabled": True, "pending_enabled": True, "volatile": {"corrected": 3, "uncorrected": 0}},
                "remapped_rows": {"correctable": 1, "uncorrectable": 0, "pending": True, "failure": False},
                "retired_pages": None,
                "recovery_action": "none",
                "fabric": {"state": "in_progress", "status": None, "clique_id": 7},
                "clocks_event_reasons": {"mask": "0x40", "active": ["hw_thermal_slowdown"]},
                "pcie": {"width": 8, "max_width": 16, "gen": 5, "max_gen": 5, "replay_counter": 2},
                "utilization": {"gpu": 97},
                "temperature_c": 88,
                "power_w": 650.5,
                "power_limit_w": 700.0,
                "persistence_mode": False,
                "nvlink": [{"link": 0, "state": "active", "errors": {"crc_flit": 4, "note": "x"}}, "junk"],
            },
            {"index": 1, "lost": True},
        ],
    }
}


def test_gpus_group_types_what_the_checks_read_and_keeps_the_documents_values() -> None:
    g = GpusFact.parse(DOC)
    assert g.available and g.driver_version == "550.54.15"
    assert g.fabric_manager is not None and g.fabric_manager.active_state == "failed"
    assert [(t.gpus, t.nvlinks) for t in g.topology] == [((0, 1), 18)]  # malformed entries dropped
    d0, d1 = g.devices
    assert d0.ecc.volatile_corrected == 3 and d0.ecc.pending_enabled is True
    assert d0.remapped_rows is not None and d0.remapped_rows.pending is True
    assert d0.retired_pages is None and d0.fabric is not None and d0.fabric.clique_id == 7
    assert d0.clocks_event_reasons.active == ("hw_thermal_slowdown",)
    assert (d0.pcie.width, d0.pcie.max_width, d0.pcie.replay_counter) == (8, 16, 2)
    assert d0.utilization_gpu == 97 and d0.temperature_c == 88 and isinstance(d0.temperature_c, int)
    assert [(lk.link, lk.errors) for lk in d0.nvlink] == [(0, {"crc_flit": 4})]
    assert d1.lost and d1.name is None and d1.ecc.enabled is None and d1.pcie.width is None
    assert g.device(1) is d1 and g.device(5) is None


def test_a_missing_or_malformed_section_reads_empty_never_raises() -> None:
    for doc in ({}, {"gpus": None}, {"gpus": {"devices": None, "topology": None}}, {"gpus": "x"}):
        g = GpusFact.parse(doc)
        assert not g.available and g.devices == () and g.topology == () and g.fabric_manager is None


def test_context_parses_a_group_once_per_host_and_none_without_facts() -> None:
    ctx = AnalysisContext(inventory=None, facts={"a": DOC}, samples={"a": {"gpus": {"devices": [{"index": 0}]}}})
    first = ctx.fact("a", GpusFact)
    assert first is not None and first is ctx.fact("a", GpusFact)
    later = ctx.fact("a", GpusFact, sample=True)
    assert later is not None and later.devices[0].index == 0 and later is not first
    assert ctx.fact("b", GpusFact) is None


def test_the_gpu_checks_read_the_typed_group_only() -> None:
    """diagnose/gpu.py reads facts through ctx.fact(host, GpusFact): no raw facts, samples or gpus dicts."""
    path = REPO / "clusterctl" / "diagnose" / "gpu.py"
    raw = [
        f"{path}:{n.lineno}: {ast.unparse(n)}"
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Attribute) and ast.unparse(n) in ("ctx.facts", "ctx.samples", "sources.gpus_section")
    ]
    assert raw == []
