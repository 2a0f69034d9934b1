"""``ethtool -S`` in the collector: the parser on the real format, and the
collection with a stand-in ethtool put first on PATH (which NICs are asked,
what a failure looks like in the document)."""

from __future__ import annotations

import os
import shutil
import stat
import threading
from pathlib import Path

from clusterctl.node import collector
from clusterctl.probe.facts import parse_facts

from probe_fakes import FIXTURES, collector_args

SAMPLE = FIXTURES / "ethtool_S_eth2.txt"
ROCE = str(FIXTURES / "sysroot_roce")


def fake_program(bindir: Path, name: str, script: str) -> None:
    bindir.mkdir(exist_ok=True)
    p = bindir / name
    p.write_text("#!/bin/sh\n" + script)
    p.chmod(p.stat().st_mode | stat.S_IXUSR)


# -- the parser ----------------------------------------------------------------


def test_sample_parsed_by_name():
    s = collector.parse_ethtool_stats(SAMPLE.read_text())
    # PFC on priority 3 only: its five pause counters, none for the others
    assert (s["rx_prio3_pause"], s["tx_prio3_pause"]) == (1284512, 22301)
    assert (s["rx_prio3_pause_duration"], s["tx_prio3_pause_duration"]) == (8911334, 95220)
    assert s["rx_prio3_pause_transition"] == 642177
    assert not [n for n in s if n.endswith("_pause") and not n.startswith(("rx_prio3", "tx_prio3"))]
    assert "rx_global_pause" not in s  # global pause off: absent, not 0
    assert (s["rx_pause_ctrl_phy"], s["tx_pause_ctrl_phy"]) == (1284512, 22301)
    assert s["rx_discards_phy"] == 0 and s["rx_prio0_buf_discard"] == 12
    assert s["rx_prio3_bytes"] == 411826263606815  # beyond 32 bits
    assert s["tx_pause_storm_error_events"] == 0


def test_sample_every_port_counter_and_no_per_queue_ones():
    lines = SAMPLE.read_text().splitlines()[1:]
    names = [ln.strip().split(": ")[0] for ln in lines]
    per_queue = [n for n in names if n.startswith(("ch0_", "rx0_", "tx0_"))]
    s = collector.parse_ethtool_stats(SAMPLE.read_text())
    assert per_queue and not set(per_queue) & set(s)
    assert sorted(s) == sorted(set(names) - set(per_queue))
    assert "rx_packets" in s and "NIC statistics" not in s


def test_order_does_not_matter():
    lines = SAMPLE.read_text().splitlines()
    shuffled = lines[:1] + list(reversed(lines[1:]))
    assert collector.parse_ethtool_stats("\n".join(shuffled)) == collector.parse_ethtool_stats(SAMPLE.read_text())


def test_error_output_and_odd_lines_give_no_counters():
    assert collector.parse_ethtool_stats("no stats available\n") == {}
    assert collector.parse_ethtool_stats("Cannot get stats strings information: Operation not supported\n") == {}
    odd = (
        "NIC statistics:\n     rx_bytes: 12\n     rx_bytes: 99\n     weird: -3\n     text: n/a\n"
        "     super: \u00b2\n     [0]: rx_ucast_packets: 5\n     rx_queue_0_bytes: 7\n"
        "     tx_queue_1_packets: 1\n     name: with: colon: 4\n"
    )
    assert collector.parse_ethtool_stats(odd) == {"rx_bytes": 12, "name: with: colon": 4}


# -- reading one NIC -----------------------------------------------------------


def test_ethtool_failure_is_a_reason(tmp_path, monkeypatch):
    fake_program(tmp_path / "bin", "ethtool", 'echo "no stats available" >&2; exit 94\n')
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert collector.ethtool_stats("eth0", 5) == (None, "ethtool -S failed (rc 94): no stats available")


def test_permission_error_keeps_ethtools_message(tmp_path, monkeypatch):
    fake_program(
        tmp_path / "bin",
        "ethtool",
        'echo "Cannot get stats strings information: Operation not permitted" >&2; exit 96\n',
    )
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert collector.ethtool_stats("eth2", 5) == (
        None,
        "ethtool -S failed (rc 96): Cannot get stats strings information: Operation not permitted",
    )


def test_driver_with_only_per_queue_counters_gives_empty_stats(tmp_path, monkeypatch):
    fake_program(tmp_path / "bin", "ethtool", "printf 'NIC statistics:\\n     rx_queue_0_packets: 4\\n'\n")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    assert collector.ethtool_stats("eth0", 5) == ({}, None)


# -- the collection on a RoCE node's sysfs tree ----------------------------------


def stand_in_ethtool(bindir: Path, log: Path) -> None:
    """ens108np0 prints the sample; any other NIC is unsupported, as ethtool says it."""
    fake_program(
        bindir,
        "ethtool",
        f"""
echo "$@" >> {log}
case "$2" in
  ens108np0) cat {SAMPLE};;
  *) echo "Cannot get stats strings information: Operation not supported" >&2; exit 96;;
esac
""",
    )


def collect(errors: list, timeout: float = 5.0) -> dict:
    nics = collector.collect_nics(errors, root=ROCE)
    collector.collect_ethtool_stats(nics, timeout, errors, root=ROCE)
    return {n["netdev"] or n["rdma"]["device"]: n for n in nics}


def test_physical_nics_are_asked_once_each(tmp_path, monkeypatch):
    log = tmp_path / "calls"
    stand_in_ethtool(tmp_path / "bin", log)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    errors: list = []
    by = collect(errors)
    assert sorted(log.read_text().splitlines()) == ["-S ens108np0", "-S ens109np0"]
    up = by["ens108np0"]
    assert up["ethtool_stats"]["rx_prio3_pause"] == 1284512 and up["ethtool_stats_reason"] is None
    down = by["ens109np0"]
    assert down["ethtool_stats"] is None
    assert down["ethtool_stats_reason"] == (
        "ethtool -S failed (rc 96): Cannot get stats strings information: Operation not supported"
    )
    assert by["br0"]["ethtool_stats"] is None and "virtual interface" in by["br0"]["ethtool_stats_reason"]
    assert by["mlx5_9"]["ethtool_stats"] is None
    assert by["mlx5_9"]["ethtool_stats_reason"] == "no netdev to ask ethtool about"
    assert errors == [{"source": "nics.ethtool_stats", "reason": down["ethtool_stats_reason"] + " (ens109np0)"}]


def test_missing_ethtool_is_one_recorded_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(collector, "SBIN_DIRS", str(tmp_path))
    errors: list = []
    by = collect(errors)
    for name in ("ens108np0", "ens109np0"):
        assert by[name]["ethtool_stats"] is None and by[name]["ethtool_stats_reason"] == "ethtool not found"
    assert errors == [{"source": "nics.ethtool_stats", "reason": "ethtool not found (ens108np0, ens109np0)"}]


def test_ethtool_in_sbin_is_found_without_sbin_on_path(tmp_path, monkeypatch):
    """A user other than root gets a PATH without /usr/sbin over SSH (Debian)."""
    fake_program(tmp_path / "sbin", "ethtool", f"exec {shutil.which('cat')} {SAMPLE}\n")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setattr(collector, "SBIN_DIRS", f"/nonexistent:{tmp_path / 'sbin'}")
    errors: list = []
    by = collect(errors)
    assert by["ens108np0"]["ethtool_stats"]["tx_prio3_pause"] == 22301
    assert errors == [] and by["ens108np0"]["ethtool_stats_reason"] is None


def test_hung_ethtools_time_out_together(tmp_path, monkeypatch):
    # Run one after the other, the second would pass the 2 s budget of all calls.
    fake_program(tmp_path / "bin", "ethtool", "exec sleep 30\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    errors: list = []
    by = collect(errors, timeout=1.0)
    for name in ("ens108np0", "ens109np0"):
        assert by[name]["ethtool_stats_reason"] == "ethtool -S timed out after 1 s"
    assert errors == [
        {"source": "nics.ethtool_stats", "reason": "ethtool -S timed out after 1 s (ens108np0, ens109np0)"}
    ]


def test_an_ethtool_that_never_returns_is_abandoned(monkeypatch):
    stuck = threading.Event()
    real = collector.ethtool_stats

    def ethtool(netdev: str, timeout: float):
        if netdev == "ens109np0":  # stuck in the kernel: killing it does not end it
            stuck.wait(30)
            return {}, None
        return real(netdev, timeout)

    monkeypatch.setattr(collector, "ethtool_stats", ethtool)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(collector, "SBIN_DIRS", "/nonexistent")
    errors: list = []
    try:
        by = collect(errors, timeout=0.3)
    finally:
        stuck.set()
    assert by["ens108np0"]["ethtool_stats_reason"] == "ethtool not found"
    assert by["ens109np0"]["ethtool_stats"] is None
    assert by["ens109np0"]["ethtool_stats_reason"] == (
        "ethtool -S did not finish within 0.6 s, the time all ethtool calls together may take"
    )


def test_whole_document_asks_the_nics_with_a_device(tmp_path, monkeypatch, fake_nvml):
    """collect() wires it in: on this machine's own /sys/class/net, exactly the
    netdevs with a ``device`` behind them are asked."""
    log = tmp_path / "calls"
    fake_program(tmp_path / "bin", "ethtool", f'echo "$2" >> {log}; cat {SAMPLE}\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    fake_nvml([])
    doc = collector.collect(collector_args())
    asked = sorted(log.read_text().split()) if log.exists() else []
    with_device = sorted(
        n["netdev"]
        for n in doc["nics"]
        if n["netdev"] and (n["rdma"] or os.path.exists(f"/sys/class/net/{n['netdev']}/device"))
    )
    assert asked == with_device
    for n in doc["nics"]:
        if n["netdev"] in asked:
            assert n["ethtool_stats"]["rx_prio3_pause"] == 1284512
        else:
            assert n["ethtool_stats"] is None and n["ethtool_stats_reason"]
    assert not [e for e in doc["errors"] if e["source"] == "nics.ethtool_stats"]


def test_typed_view_and_older_documents():
    doc = {
        "schema": 1,
        "collected_at": "x",
        "host": {},
        "gpus": {"available": False},
        "nics": [
            {"netdev": "eth2", "ethtool_stats": {"rx_prio3_pause": 5}, "ethtool_stats_reason": None},
            {"netdev": "eth3"},
        ],
    }
    f = parse_facts(doc)
    assert f.nics[0].ethtool_stats == {"rx_prio3_pause": 5} and f.nics[0].ethtool_stats_reason is None
    assert f.nics[1].ethtool_stats is None
    assert f.nics[1].ethtool_stats_reason == "not in this facts document (an older collector)"
