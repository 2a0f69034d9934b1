"""The fact groups' parsers (clusterctl/probe/factgroups.py) on the collector's real output.

Each group is parsed from what ``clusterctl/node/collector.py`` writes for the real
samples under tests/fixtures/probe (see its README: the kern.log lines come from
samples/gpu/dmesg_xid_mixed.log, the sysfs tree from samples/roce), and from the
malformed or partial documents the checks must survive: a missing or unreadable group
reads empty with a reason (the checks say UNKNOWN), never an exception.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import gpu_facts as G

from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.registry import AnalysisContext
from clusterctl.diagnose.xid import check_xid
from clusterctl.node import collector
from clusterctl.probe.factgroups import SCHEMA, KernelLogFact, schema_problem

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "probe"


def test_the_parsers_read_the_collectors_schema() -> None:
    assert SCHEMA == collector.SCHEMA
    assert schema_problem({"schema": collector.SCHEMA}) is None and schema_problem({}) is None
    assert "facts schema 2" in (schema_problem({"schema": 2}) or "")
    assert schema_problem({"schema": "1"}) is not None and schema_problem({"schema": True}) is not None


# ----------------------------------------------------------------- kernel_log


def _kern_log_doc(tmp_path: Path) -> dict[str, object]:
    log = tmp_path / "var" / "log"
    log.mkdir(parents=True)
    shutil.copy(FIXTURES / "kern.log", log / "kern.log")
    errors: list[dict[str, str]] = []
    section = collector.read_kern_log(None, 1000, errors, root=str(tmp_path))
    return {"schema": collector.SCHEMA, "host": {"boot_id": "b-now"}, "kernel_log": section, "errors": errors}


def test_kernel_log_group_from_the_collectors_kern_log_reading(tmp_path: Path) -> None:
    doc = _kern_log_doc(tmp_path)
    kl = KernelLogFact.parse(doc)
    want = [x["text"] for x in doc["kernel_log"]["lines"]]  # type: ignore[index]
    assert kl.source == "/var/log/kern.log" and kl.texts == want and len(want) > 5
    assert any("NVRM: Xid (PCI:0000:86:00): 63" in t for t in kl.texts)
    assert all(x.time is not None for x in kl.lines) and kl.boot_id == "b-now"
    assert kl.cursor and kl.cursor.startswith("file:") and not kl.truncated and kl.reasons == ()


def test_kernel_log_journal_lines_keep_boot_and_priority_and_drop_junk() -> None:
    doc = {
        "host": {"boot_id": "b2"},
        "kernel_log": {
            "source": "journal",
            "cursor": "s=1;i=2",
            "truncated": True,
            "lines": [
                {"time": 1764500000.5, "boot_id": "b1", "priority": 4, "text": "NVRM: Xid (PCI:0000:1b:00): 79"},
                {"time": True, "text": None},  # a bool is no time; text kept as the checks always read it
                "junk",
                {"boot_id": "b2"},
            ],
        },
    }
    kl = KernelLogFact.parse(doc)
    assert [(x.text, x.time, x.boot_id, x.priority) for x in kl.lines] == [
        ("NVRM: Xid (PCI:0000:1b:00): 79", 1764500000.5, "b1", 4),
        ("None", None, None, None),
        ("", None, "b2", None),
    ]
    assert kl.truncated and kl.source == "journal" and kl.boot_id == "b2"


def test_no_kernel_log_reads_empty_with_the_collectors_reason() -> None:
    errors = [{"source": "kernel_log", "reason": "journalctl: permission denied"}, {"source": "units", "reason": "x"}]
    for doc in ({"kernel_log": {"source": None, "lines": [{"text": "stale"}]}, "errors": errors}, {"errors": errors}):
        kl = KernelLogFact.parse(doc)
        assert kl.source is None and kl.lines == () and kl.reasons == ("journalctl: permission denied",)
    for doc in ({}, {"kernel_log": "x", "errors": "x", "host": []}, {"kernel_log": {"lines": None, "source": ""}}):
        kl = KernelLogFact.parse(doc)
        assert kl.source is None and kl.lines == () and kl.reasons == () and kl.boot_id is None


def test_a_document_of_another_schema_is_unknown_for_the_kernel_log_checks() -> None:
    facts = G.host_facts("gpu01", kernel=["NVRM: Xid (PCI:0000:1b:00): 79, pid=1, GPU has fallen off the bus."])
    facts["schema"] = 2
    kl = KernelLogFact.parse(facts)
    assert kl.source is None and kl.lines == () and "facts schema 2" in kl.reasons[0]
    (f,) = check_xid(AnalysisContext(inventory=None, facts={"gpu01": facts}))
    assert f.severity == Severity.UNKNOWN and "facts schema 2" in f.message
