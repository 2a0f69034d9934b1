"""``clusterctl facts`` sees the NIC driver counters of ``ethtool -S`` moving:
a PFC pause storm injected on one lab host raises that host's priority-3
pause counters between two collections, and nobody else's."""

from __future__ import annotations

import datetime
import json
import time

from clusterctl.cli.main import main
from clusterctl.lab.hardware import faults

RATE = 20000  # pause frames a second


def facts(lab, capsys) -> dict:
    """``clusterctl facts all --json``: host name -> facts document."""
    rc = main(["facts", "all", "-i", str(lab.inventory), "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out[-2000:]
    return json.loads(out)


def nic(doc: dict, name: str) -> dict:
    return next(n for n in doc["nics"] if n["netdev"] == name)


def epoch(doc: dict) -> float:
    return datetime.datetime.fromisoformat(doc["collected_at"]).timestamp()


def test_pause_storm_moves_the_pause_counter_on_that_host_only(lab, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    victim = lab.names[-1]  # reached as the non-root user ops: ethtool (/usr/sbin) is not on its PATH
    try:
        faults.inject(lab.host_dir(victim), "pause-storm", nic="eth2", priority=3, per_s=RATE)
        first = facts(lab, capsys)
        time.sleep(2.0)
        second = facts(lab, capsys)
    finally:
        faults.heal(lab.host_dir(victim))

    for name in lab.names:
        a, b = first[name], second[name]
        assert not [e for e in a["errors"] + b["errors"] if e["source"] == "nics.ethtool_stats"]
        eth0 = nic(a, "eth0")  # the container's veth: virtual, not asked
        assert eth0["ethtool_stats"] is None and eth0["ethtool_stats_reason"].startswith("not read: virtual")
        for port in ("eth2", "eth3"):
            s1, s2 = nic(a, port)["ethtool_stats"], nic(b, port)["ethtool_stats"]
            assert nic(a, port)["ethtool_stats_reason"] is None
            moved = s2["rx_prio3_pause"] - s1["rx_prio3_pause"]
            if (name, port) != (victim, "eth2"):
                assert moved == 0, (name, port)
                continue
            # Each ethtool ran within [collected_at, collected_at + duration_s] of its document.
            least = epoch(b) - epoch(a) - a["duration_s"]
            most = epoch(b) + b["duration_s"] - epoch(a)
            assert RATE * least - 1 <= moved <= RATE * most + 1, (moved, least, most)
            # the driver's link-level pause counter counts the same frames
            assert s2["rx_pause_ctrl_phy"] - s1["rx_pause_ctrl_phy"] == moved
            assert s2["rx_prio3_pause_duration"] > s1["rx_prio3_pause_duration"]
            assert s2["tx_prio3_pause"] == s1["tx_prio3_pause"]  # an rx storm: we are paused, we send none
