"""Doctor's run overlaps its sampling interval with the probe's work.

The collector takes the first NIC-counter samples before reading the GPUs
and waits only what is left of the interval for the second ones; the
samples stay at least the interval apart.
"""

from __future__ import annotations

import time

from clusterctl.probe import collector

from test_roce_probe import NIC, sysroot, tool


def test_work_between_the_samples_is_not_added_to_the_interval(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool(bindir, "ethtool", 'echo "NIC statistics:"; echo "     rx_prio3_pause: 1"\n')
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    root = str(sysroot(tmp_path, mlnx=False))
    nics = [dict(NIC, samples=None)]
    errors: list = []
    started = collector.start_samples(nics, 5.0, errors, root)
    time.sleep(0.4)                                   # the GPUs, units, kernel log being read
    t = time.monotonic()
    collector.finish_samples(started, 0.6, 5.0, errors, root)
    waited = time.monotonic() - t
    s0, s1 = nics[0]["samples"]
    assert errors == [] and s1["t"] - s0["t"] >= 0.6
    assert waited < 0.45                              # 0.6 - 0.4 left to wait, plus one ethtool run


def test_work_longer_than_the_interval_means_no_wait(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool(bindir, "ethtool", 'echo "NIC statistics:"; echo "     rx_prio3_pause: 1"\n')
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    root = str(sysroot(tmp_path, mlnx=False))
    nics = [dict(NIC, samples=None)]
    started = collector.start_samples(nics, 5.0, [], root)
    time.sleep(0.3)
    t = time.monotonic()
    collector.finish_samples(started, 0.1, 5.0, [], root)
    assert time.monotonic() - t < 0.25 and len(nics[0]["samples"]) == 2


def test_collector_reads_the_gpus_inside_the_counter_interval(monkeypatch):
    order: list[str] = []
    monkeypatch.setattr(collector, "start_samples", lambda *a: order.append("first samples") or ([], 0.0))
    monkeypatch.setattr(collector, "finish_samples", lambda *a: order.append("second samples"))
    monkeypatch.setattr(collector, "collect_gpus", lambda *a: order.append("gpus") or {"devices": []})
    monkeypatch.setattr(collector, "collect_kernel_log", lambda *a: order.append("kernel log"))
    collector.collect(collector.parse_args(["--counter-interval", "2", "--nvml-budget", "1"]))
    assert order == ["first samples", "gpus", "kernel log", "second samples"]
