"""gpu.xid on recorded kernel logs and on other log layouts."""

from __future__ import annotations

import pytest

from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.xid import check_xid, parse_xid

import gpu_facts as G


def by_subject(findings):
    return {(f.subject, f.message.split(" ")[1] if f.message.startswith("XID") else f.message): f for f in findings}


@pytest.mark.parametrize(
    "line, pci, xid, pid, name, gi",
    [
        (
            "[612001.993318] NVRM: Xid (PCI:0000:2b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
            "0000:2b:00",
            79,
            None,
            None,
            None,
        ),
        ("[500012.771300] NVRM: Xid (PCI:0000:3f:00): 46", "0000:3f:00", 46, None, None, None),
        (
            "[201733.556120] NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=7194, Contained: CE User Channel (0x9).",
            "0000:01:00",
            94,
            "7194",
            None,
            5,
        ),
        (
            "Nov 30 10:11:02 gpu03 kernel: [204114.9] NVRM: Xid (PCI:0000:2A:00): 48, pid=88213, name=python3, DBE",
            "0000:2a:00",
            48,
            "88213",
            "python3",
            None,
        ),
        (
            "2026-11-30T10:02:13+0000 gpu07 kernel: NVRM: Xid (PCI:00000000:5D:00.0): 13, pid=1, name=x, m",
            "0000:5d:00",
            13,
            "1",
            "x",
            None,
        ),
        (
            "[700211.420050] NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal   XC0 i0 Link 09 (0x025525c6)",
            "0018:01:00",
            149,
            None,
            None,
            None,
        ),
    ],
)
def test_every_line_form_parses(line, pci, xid, pid, name, gi):
    ev = parse_xid(line)
    assert ev is not None
    assert (ev.pci, ev.xid, ev.pid, ev.name, ev.gi) == (pci, xid, pid, name, gi)


def test_non_xid_lines_are_not_xids():
    assert parse_xid("[800321.555555] nvidia-nvswitch2: SXid (PCI:0000:87:00.0): 12028, Non-fatal, Link 32") is None
    assert parse_xid("mlx5_core 0000:1a:00.0 ibp26s0: Link down") is None


def test_recorded_mixed_log_classifies_each_code():
    c = G.ctx(raw={"node1": {"kernel.log": G.fixture("gpu/dmesg_xid_mixed.log")}}, inv=None)
    f = {(x.subject, x.message.split(" ")[1]): x for x in check_xid(c) if x.message.startswith("XID")}
    assert f[("gpu:0000:2b:00", "79")].severity == Severity.CRIT
    assert "power-cycle" in f[("gpu:0000:2b:00", "79")].action
    assert f[("gpu:0000:3b:00", "48")].severity == Severity.CRIT
    assert f[("gpu:0000:3b:00", "95")].severity == Severity.CRIT
    assert "reset the GPU" in f[("gpu:0000:3b:00", "95")].action
    assert f[("gpu:0000:86:00", "63")].severity == Severity.WARN
    assert f[("gpu:0000:b5:00", "13")].severity == Severity.WARN  # application error
    assert "1 event" in f[("gpu:0000:b5:00", "13")].message  # two lines, one event
    assert f[("gpu:0000:65:00", "43")].severity == Severity.WARN
    assert f[("gpu:0000:01:00/gi:5", "94")].severity == Severity.CRIT  # MIG form
    assert f[("gpu:0000:3f:00", "46")].severity == Severity.CRIT  # no-comma form
    assert "GPU Reset Required" in f[("gpu:0008:01:00", "154")].action
    assert f[("gpu:0002:00:00", "119")].message.endswith("2 events, last by pid 1582259 (nvc:[driver])")
    others = [x for x in check_xid(c) if not x.message.startswith(("XID", "NVSwitch"))]
    assert [x.subject for x in others] == ["driver"]  # probe routine failed
    assert "not supported" in " ".join(others[0].evidence)
    # the separate "fallen off the bus" line is folded into XID 79, not a second finding
    assert sum(1 for x in check_xid(c) if x.subject == "gpu:0000:2b:00") == 1


def test_xid_maps_to_the_gpu_index_by_pci_address():
    facts = G.host_facts("gpu07", kernel=G.fixture("gpu/journal_short_iso_xid.log").splitlines())
    found = check_xid(G.ctx({"gpu07": facts}, inv=None))
    lost = [x for x in found if x.message.startswith("XID 79")]
    assert [(x.subject, x.severity) for x in lost] == [("gpu:3", Severity.CRIT)]  # 0000:5d:00 is index 3


def test_repeated_application_xid_on_one_gpu_escalates():
    facts = G.host_facts("gpu07", kernel=G.fixture("gpu/journal_short_iso_xid.log").splitlines())
    found = {x.subject: x for x in check_xid(G.ctx({"gpu07": facts}, inv=None))}
    assert found["gpu:0"].severity == Severity.CRIT
    assert found["gpu:0"].message.startswith("XID 13 GR_EXCEPTION") and "3 events" in found["gpu:0"].message
    assert "suspect the hardware" in found["gpu:0"].action


def test_syslog_and_dmesg_T_forms_and_a_lone_fallen_off_line():
    c = G.ctx({"gpu03": G.host_facts("gpu03", kernel=G.fixture("gpu/syslog_dmesg_T_xid.log").splitlines())}, inv=None)
    found = {(x.subject, x.severity): x for x in check_xid(c)}
    assert ("gpu:1", Severity.CRIT) in found  # 48 on 0000:2A:00 (upper case)
    assert ("gpu:1", Severity.WARN) in found  # 63 on the same GPU
    lone = found[("gpu:2", Severity.CRIT)]
    assert lone.message == "GPU has fallen off the bus (no XID line)"


def test_clean_log_is_ok_and_unreadable_log_is_unknown():
    clean = G.host_facts("gpu01", kernel=["usb 1-1: new high-speed USB device"])
    blind = G.host_facts("gpu02")
    blind["kernel_log"]["source"] = None
    blind["errors"] = [{"source": "kernel_log", "reason": "journalctl: permission denied"}]
    found = {x.host: x for x in check_xid(G.ctx({"gpu01": clean, "gpu02": blind}))}
    assert found["gpu01"].severity == Severity.OK
    assert found["gpu02"].severity == Severity.UNKNOWN and "permission denied" in found["gpu02"].message


def test_unknown_code_is_a_warning_pointing_at_the_catalogue():
    c = G.ctx(raw={"n": {"kernel.log": "NVRM: Xid (PCI:0000:18:00): 999, pid=1, name=x, new thing\n"}}, inv=None)
    (f,) = check_xid(c)
    assert f.severity == Severity.WARN and "catalogue" in f.action


def test_nvswitch_sxids():
    text = (
        G.fixture("gpu/dmesg_xid_mixed.log")
        + "[800322.1] nvidia-nvswitch2: SXid (PCI:0000:87:00.0): 24007, Fatal, Link 12 sourcetrack timeout\n"
    )
    c = G.ctx(raw={"n": {"kernel.log": text}}, inv=None)
    sx = {x.message.split(" (")[0]: x for x in check_xid(c) if x.subject == "nvswitch:2"}
    assert sx["NVSwitch SXid 12028"].severity == Severity.WARN
    assert sx["NVSwitch SXid 24007"].severity == Severity.CRIT and "fabric manager" in sx["NVSwitch SXid 24007"].action
