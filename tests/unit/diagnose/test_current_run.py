"""Findings from log lines belong to the current run (issue 28): a unit's journal
counts from its last start, the kernel log from the current boot, unless
``--since`` asks for more; older problems are history rows; ``doctor ack``."""

from __future__ import annotations

import json
import time

from clusterctl.cli.main import main
from clusterctl.diagnose import acks
from clusterctl.diagnose.current import HISTORY, parse_when, split_unit_log
from clusterctl.diagnose.doctor import diagnose
from clusterctl.diagnose.findings import Severity, exit_code

import gpu_facts as G

T0 = "2026-11-30T10:40:00+0000"


def journal(lines: str, stamp: str, pid: int = 7140) -> list[str]:
    """vLLM's recorded output as ``journalctl -u UNIT -o short-iso`` prints it."""
    return [f"{stamp} gpu01 vllm[{pid}]: {x}" for x in lines.splitlines() if x.strip()]


def starting(stamp: str) -> str:
    return f"{stamp} gpu01 systemd[1]: Starting clusterctl-qwen-a.service - vLLM qwen-a..."


def died_then_restarted() -> str:
    """The recorded engine death (10:50), systemd's restart, then the recorded successful start-up (11:00)."""
    lines = [starting(T0)] + journal(G.fixture("vllm/runtime_engine_dead_nccl_v0.11.0.log"), "2026-11-30T10:50:12+0000")
    lines += [
        "2026-11-30T10:50:13+0000 gpu01 systemd[1]: clusterctl-qwen-a.service: Main process exited, "
        "code=exited, status=1/FAILURE",
        starting("2026-11-30T11:00:00+0000"),
    ]
    lines += journal(G.fixture("vllm/startup_success_v0.11.0.log"), "2026-11-30T11:00:30+0000", pid=9000)
    return "\n".join(lines) + "\n"


def engine_rows(findings):
    return [f for f in findings if f.check == "serving.engine" and f.subject == "instance:qwen-a"]


def test_an_engine_death_before_the_units_last_start_is_history_not_crit():
    ctx = G.ctx(G.healthy(), raw={"gpu01": {"qwen-a.log": died_then_restarted()}})
    rows = engine_rows(diagnose(ctx, ["serving.engine"]))
    assert rows and not any(f.severity == Severity.CRIT for f in rows), rows
    old = [f for f in rows if f.message.startswith(HISTORY)]
    assert any("CRIT before the current run or boot: TP worker rank 1" in f.message for f in old), old
    assert all(f.severity == Severity.OK for f in old)
    assert exit_code(diagnose(ctx, ["serving.engine"])) == 0

    # The same death in the current run is CRIT (the journal shows no later start).
    one_run = died_then_restarted().split(starting("2026-11-30T11:00:00+0000"))[0]
    rows = engine_rows(diagnose(G.ctx(G.healthy(), raw={"gpu01": {"qwen-a.log": one_run}}), ["serving.engine"]))
    assert any(f.severity == Severity.CRIT for f in rows)


def test_since_counts_older_lines_again():
    ctx = G.ctx(G.healthy(), raw={"gpu01": {"qwen-a.log": died_then_restarted()}})
    since = parse_when("2026-11-30T10:30:00Z", 0)
    rows = engine_rows(diagnose(ctx, ["serving.engine"], since=since))
    assert any(f.severity == Severity.CRIT for f in rows)
    later = parse_when("2026-11-30T10:55:00Z", 0)  # after the death: still history
    assert not any(f.severity == Severity.CRIT for f in engine_rows(diagnose(ctx, ["serving.engine"], since=later)))


def test_split_keeps_a_log_without_a_start_line_whole():
    text = "".join(x + "\n" for x in journal(G.fixture("vllm/runtime_engine_dead_nccl_v0.11.0.log"), T0))
    assert split_unit_log(text, "clusterctl-qwen-a.service") == ("", text)


def test_kernel_xids_of_an_earlier_boot_are_history():
    xids = G.fixture("gpu/journal_short_iso_xid.log").replace("gpu07", "gpu01")
    reboot = (
        "-- Boot 3c1f0d2e6a4b4c55a0c1b2d3e4f50617 --\n"
        "2026-11-30T12:00:00+0000 gpu01 kernel: Linux version 6.8.0-49-generic (buildd@lcy02) #49-Ubuntu\n"
        "2026-11-30T12:00:05+0000 gpu01 kernel: nvidia: loading out-of-tree module taints kernel.\n"
    )
    ctx = G.ctx(G.healthy(), raw={"gpu01": {"kernel.log": xids + reboot}})
    found = [f for f in diagnose(ctx, ["gpu.xid"]) if f.host == "gpu01"]
    assert not any(f.severity in (Severity.CRIT, Severity.WARN) for f in found)
    assert any(f.message.startswith(HISTORY + "CRIT") and "XID 79" in f.message for f in found)
    # the same lines in the current boot are CRIT
    current = [
        f for f in diagnose(G.ctx(G.healthy(), raw={"gpu01": {"kernel.log": xids}}), ["gpu.xid"]) if f.host == "gpu01"
    ]
    assert any(f.severity == Severity.CRIT and "XID 79" in f.message for f in current)


def test_probe_kernel_lines_of_another_boot_id_are_history():
    facts = G.healthy()
    facts["gpu01"]["host"]["boot_id"] = "now-boot"
    facts["gpu01"]["kernel_log"]["lines"] = [
        {
            "time": 1.0,
            "boot_id": "old-boot",
            "priority": 3,
            "text": "NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        },
        {"time": 2.0, "boot_id": "now-boot", "priority": 6, "text": "nvidia-modeset: Loading NVIDIA Kernel Mode"},
    ]
    found = [f for f in diagnose(G.ctx(facts), ["gpu.xid"]) if f.host == "gpu01"]
    assert not any(f.severity == Severity.CRIT for f in found)
    assert any(f.message.startswith(HISTORY) and "gpu:1" == f.subject for f in found)
    assert any(f.severity == Severity.CRIT for f in diagnose(G.ctx(facts), ["gpu.xid"], since=0.5))


def test_an_acknowledged_finding_is_ok_until_it_expires(tmp_path):
    facts = G.healthy()
    facts["gpu01"]["kernel_log"]["lines"] = [
        {
            "time": None,
            "boot_id": None,
            "priority": None,
            "text": "NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        }
    ]
    ctx = G.ctx(facts)
    now = time.time()
    acks.add(tmp_path, "gpu.xid", "gpu:1", now + 3600, host="gpu01", reason="RMA 4411", now=now)
    saved = json.loads((tmp_path / "acks.json").read_text())["acks"]
    assert saved[0]["check"] == "gpu.xid" and saved[0]["reason"] == "RMA 4411"
    got = diagnose(ctx, ["gpu.xid"], acks=acks.load(tmp_path), now=now)
    [row] = [f for f in got if f.subject == "gpu:1"]
    assert row.severity == Severity.OK and row.message.startswith("acknowledged until ") and "RMA 4411" in row.message
    assert exit_code(got) == 0
    expired = diagnose(ctx, ["gpu.xid"], acks=acks.load(tmp_path), now=now + 7200)
    assert exit_code(expired) == 2
    # on another host it does not apply
    other = acks.load(tmp_path)
    other[0]["host"] = "gpu02"
    assert exit_code(diagnose(ctx, ["gpu.xid"], acks=other, now=now)) == 2
    assert acks.remove(tmp_path, "gpu.xid", "gpu:1") == 1 and acks.load(tmp_path) == []


def test_doctor_ack_command_and_doctor_from_a_bundle_show_it(tmp_path, monkeypatch, capsys):
    from clusterctl.diagnose.bundle import Snapshot, write_bundle

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    facts = G.healthy()
    facts["gpu01"]["kernel_log"]["lines"] = [
        {
            "time": None,
            "boot_id": None,
            "priority": None,
            "text": "NVRM: Xid (PCI:0000:2a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        }
    ]
    dest = write_bundle(Snapshot(facts=facts), tmp_path / "b.tar.gz", G.INVENTORY)
    assert main(["doctor", "--from", str(dest), "--checks", "xid"]) == 2
    capsys.readouterr()
    assert main(["doctor", "ack", "gpu.xid", "gpu:1", "--until", "2d", "--reason", "RMA 4411"]) == 0
    assert "acknowledged gpu.xid gpu:1 on every host until" in capsys.readouterr().out
    assert main(["doctor", "--from", str(dest), "--checks", "xid", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["meta"]["acknowledged"] == 1
    assert main(["doctor", "ack", "--list"]) == 0
    assert "gpu.xid gpu:1 on every host until" in capsys.readouterr().out
    assert main(["doctor", "ack", "gpu.xid", "gpu:1"]) == 3  # no --until: acks expire
    assert main(["doctor", "ack", "gpu.xid", "gpu:1", "--until", "soon"]) == 3
    assert main(["doctor", "ack", "gpu.xid", "gpu:1", "--remove"]) == 0
    assert main(["doctor", "--from", str(dest), "--checks", "xid"]) == 2
    assert main(["doctor", "--from", str(dest), "--since", "yesterday"]) == 3


def test_a_start_line_of_systemd_before_250_names_the_description():
    old = [starting(T0), f"{T0} gpu01 vllm[1]: ERROR engine died"]
    new = [
        "2026-11-30T11:00:00+0000 gpu01 systemd[1]: Starting vLLM qwen-a: qwen3-8b on gpu01 GPU 0,1 port 8000...",
        "2026-11-30T11:00:01+0000 gpu01 vllm[2]: INFO started",
    ]
    hist, cur = split_unit_log("\n".join(old + new) + "\n", "clusterctl-qwen-a.service")
    assert hist == "\n".join(old) + "\n" and cur == "\n".join(new) + "\n"


def test_doctor_with_an_inventory_sees_the_acks_doctor_ack_wrote_for_its_cluster(tmp_path, monkeypatch, capsys):
    """``doctor ack -i INV`` keeps the acknowledgement in INV's cluster state; ``doctor -i INV``
    reads it from there (it read the default state before the inventory bound its cluster)."""
    from pathlib import Path

    from clusterctl.diagnose.bundle import Snapshot, write_bundle

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("CLUSTERCTL_INVENTORY", raising=False)
    monkeypatch.chdir(tmp_path)
    facts = G.healthy()
    facts["gpu01"]["kernel_log"]["lines"] = [
        {
            "time": None,
            "boot_id": None,
            "priority": None,
            "text": "NVRM: Xid (PCI:0000:2a:00): 79, GPU has fallen off the bus.",
        }
    ]
    dest = write_bundle(Snapshot(facts=facts), tmp_path / "b.tar.gz", G.INVENTORY)
    inv = tmp_path / "inv.yaml"
    inv.write_text(G.INVENTORY)
    assert main(["doctor", "ack", "gpu.xid", "gpu:1", "--until", "2d", "-i", str(inv)]) == 0
    assert "/clusters/" in capsys.readouterr().out  # kept in the cluster's state
    assert main(["doctor", "--from", str(dest), "--checks", "xid", "-i", str(inv), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["meta"]["acknowledged"] == 1
    assert not list(Path(tmp_path / "state").glob("clusterctl/acks.json"))
