"""The fact groups' parsers (clusterctl/probe/factgroups.py) on the collector's real output.

Each group is parsed from what ``clusterctl/node/collector.py`` writes for the real
samples under tests/fixtures/probe (see its README: the kern.log lines come from
samples/gpu/dmesg_xid_mixed.log, the sysfs tree from samples/roce), and from the
malformed or partial documents the checks must survive: a missing or unreadable group
reads empty with a reason (the checks say UNKNOWN), never an exception.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import gpu_facts as G
import pytest

from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.instances import check_units
from clusterctl.diagnose.registry import AnalysisContext
from clusterctl.diagnose.xid import check_xid
from clusterctl.node import collector
from clusterctl.probe.factgroups import SCHEMA, KernelLogFact, UnitsFact, schema_problem

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


# ----------------------------------------------------------------- units

# ``systemctl show --property=...`` as systemd 255 prints it for two vLLM units (the
# properties the collector asks for; docs/facts.md ``units[]``).
SHOW = """Id=clusterctl-qwen-a.service
LoadState=loaded
ActiveState=active
SubState=running
UnitFileState=enabled
Result=success
NRestarts=2
MainPID=4242
ExecMainStatus=0
StateChangeTimestamp=Mon 2026-11-30 10:00:00 UTC
StateChangeTimestampMonotonic=100000000
LimitMEMLOCK=infinity
Environment=NCCL_IB_TC=106 "VLLM_LOGGING_PREFIX=a b" HF_TOKEN=hf_secret
EnvironmentFiles=/etc/clusterctl/qwen-a.env (ignore_errors=no)

Id=clusterctl-qwen-b.service
LoadState=loaded
ActiveState=activating
SubState=auto-restart
UnitFileState=disabled
Result=oom-kill
NRestarts=5
MainPID=0
ExecMainStatus=137
StateChangeTimestamp=Mon 2026-11-30 10:05:00 UTC
StateChangeTimestampMonotonic=400000000
LimitMEMLOCK=8388608
"""


def _collected_units(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    def run(cmd: list[str], timeout: float) -> tuple[int, str, str]:
        if cmd[1] == "list-units":
            return 0, "clusterctl-qwen-a.service loaded active running vLLM qwen-a\n", ""
        if cmd[1] == "list-unit-files":
            return 0, "clusterctl-qwen-b.service disabled enabled\n", ""
        return 0, SHOW, ""

    monkeypatch.setattr(collector, "run_command", run)
    errors: list[dict[str, str]] = []
    args = argparse.Namespace(cmd_timeout=5.0, unit_pattern="clusterctl-*")
    return {"schema": 1, "units": collector.collect_units(args, errors, 1000.0), "errors": errors}


def test_units_group_from_the_collectors_systemctl_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    u = UnitsFact.parse(_collected_units(monkeypatch))
    assert (
        u.read
        and u.reasons == ()
        and [x.unit for x in u.units]
        == [
            "clusterctl-qwen-a.service",
            "clusterctl-qwen-b.service",
        ]
    )
    a, b = u.units
    assert (a.active_state, a.sub_state, a.restarts, a.main_pid, a.result) == ("active", "running", 2, 4242, "success")
    assert a.limit_memlock == "infinity" and a.limit_memlock_read and a.loaded and a.since
    assert a.environment == {"NCCL_IB_TC": "106", "VLLM_LOGGING_PREFIX": "a b", "HF_TOKEN": None}
    assert a.environment_files == ("/etc/clusterctl/qwen-a.env",)
    assert (b.active_state, b.sub_state, b.result, b.exec_main_status, b.main_pid) == (
        "activating",
        "auto-restart",
        "oom-kill",
        137,
        None,
    )
    assert b.limit_memlock == 8388608 and u.get("clusterctl-qwen-b.service") is b and u.get("x") is None


def test_unread_units_say_why_and_partial_entries_read_as_defaults() -> None:
    err = [{"source": "units", "reason": "systemctl not found"}]
    assert UnitsFact.parse({"units": None, "errors": err}).reasons == ("systemctl not found",)
    for doc, why in (
        ({}, "systemctl did not answer"),
        ({"units": {"clusterctl-a.service": {}}}, "the units section is malformed"),
        ({"schema": 3, "units": []}, "facts schema 3"),
    ):
        u = UnitsFact.parse(doc)
        assert not u.read and u.units == () and why in u.reasons[0]
    u = UnitsFact.parse({"units": [{"unit": "clusterctl-a.service"}, {"unit": None}, "junk", {"restarts": 4}]})
    assert u.read and [x.unit for x in u.units] == ["clusterctl-a.service"]
    (a,) = u.units
    assert a.restarts == 0 and a.active_state is None and a.environment is None and not a.limit_memlock_read
    assert UnitsFact.parse({"units": [{"unit": "x", "load_state": "not-found"}]}).units[0].loaded is False


def test_malformed_or_foreign_units_are_unknown_for_the_serving_unit_check_never_ok() -> None:
    facts = G.healthy()
    facts["gpu01"]["units"] = {"clusterctl-qwen-a.service": {"active_state": "active"}}  # not a list
    facts["gpu02"]["schema"] = 2
    facts["gpu02"]["units"] = [{"unit": "clusterctl-llama.service", "load_state": "loaded", "active_state": "active"}]
    found = {f.subject: f for f in check_units(G.ctx(facts))}
    assert {s: f.severity for s, f in found.items()} == {
        "instance:qwen-a": Severity.UNKNOWN,
        "instance:qwen-b": Severity.UNKNOWN,
        "instance:llama": Severity.UNKNOWN,
    }
