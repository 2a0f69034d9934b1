"""What makes a doctor run short, and stays correct.

The collector takes the first NIC-counter samples before reading the GPUs
and waits only what is left of the interval for the second ones; the
samples stay at least the interval apart.  The probe's payload carries its
code compiled for nodes whose Python writes the same bytecode, and the source
for every other node.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest

from clusterctl.node import collector
from clusterctl.probe.payload import build_payload

from test_roce_probe import NIC, sysroot, tool


@pytest.fixture
def one_nic(tmp_path, monkeypatch) -> tuple[list, str]:
    """One RoCE NIC in a fake sysfs, with an ``ethtool`` stand-in."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    tool(bindir, "ethtool", 'echo "NIC statistics:"; echo "     rx_prio3_pause: 1"\n')
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    return [dict(NIC, samples=None)], str(sysroot(tmp_path, mlnx=False))


@pytest.mark.parametrize(
    "work_s, interval_s, most_wait_s",
    [
        (0.4, 0.6, 0.45),  # 0.2 s left to wait, plus one ethtool run
        (0.3, 0.1, 0.25),  # work longer than the interval: no wait at all
    ],
)
def test_work_between_the_samples_is_not_added_to_the_interval(one_nic, work_s, interval_s, most_wait_s):
    nics, root = one_nic
    errors: list = []
    started = collector.start_samples(nics, 5.0, errors, root)
    time.sleep(work_s)  # the GPUs, units, kernel log being read
    t = time.monotonic()
    collector.finish_samples(started, interval_s, 5.0, errors, root)
    waited = time.monotonic() - t
    s0, s1 = nics[0]["samples"]
    assert errors == [] and s1["t"] - s0["t"] >= interval_s
    assert waited < most_wait_s


def test_collector_reads_the_gpus_inside_the_counter_interval(monkeypatch):
    order: list[str] = []
    monkeypatch.setattr(collector, "start_samples", lambda *a: order.append("first samples") or ([], 0.0))
    monkeypatch.setattr(collector, "finish_samples", lambda *a: order.append("second samples"))
    monkeypatch.setattr(collector, "collect_gpus", lambda *a: order.append("gpus") or {"devices": []})
    monkeypatch.setattr(collector, "collect_kernel_log", lambda *a: order.append("kernel log"))
    collector.collect(collector.parse_args(["--counter-interval", "2", "--nvml-budget", "1"]))
    assert order == ["first samples", "gpus", "kernel log", "second samples"]


def _line(data: bytes, name: str) -> bytes:
    return re.search(rb"^" + name.encode() + rb" = .*$", data, re.M).group(0)


def test_payload_runs_the_compiled_code_on_a_matching_python_and_the_source_elsewhere():
    compiled = build_payload(collector=b"print('ran the compiled code')\n", pynvml_source=b"", pynvml_version="0")
    source = build_payload(collector=b"print('compiled the source')\n", pynvml_source=b"", pynvml_version="0")
    # compiled code of one collector, source of the other: the output says which one ran
    mixed = compiled.data.replace(_line(compiled.data, "_COLLECTOR"), _line(source.data, "_COLLECTOR"))

    def run(data: bytes) -> str:
        return (
            subprocess.run([sys.executable, "-I", "-B", "-"], input=data, capture_output=True, timeout=30, check=True)
            .stdout.decode()
            .strip()
        )

    assert run(mixed) == "ran the compiled code"
    other_python = mixed.replace(_line(mixed, "_CODE_TAG"), b"_CODE_TAG = ['cpython', '00000000']")
    assert run(other_python) == "compiled the source"
    broken = mixed.replace(_line(mixed, "_COLLECTOR_CODE"), b"_COLLECTOR_CODE = 'bm90IHpsaWI='")
    assert run(broken) == "compiled the source"  # unreadable code: the source still runs


def test_an_instance_that_accepts_but_never_answers_costs_its_timeout_once_per_sample():
    import json
    import socket

    from clusterctl.probe.snapshot import NODE_SCRIPT

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # connections complete, nothing is ever read
    try:
        spec = {
            "instances": {"stuck": {"unit": "clusterctl-stuck.service", "port": silent.getsockname()[1], "host": None}},
            "journal": False,
            "timeout_s": 0.5,
            "interval_s": 0.3,
        }
        t = time.monotonic()
        p = subprocess.run(
            [sys.executable, "-I", "-B", "-", json.dumps(spec)],
            input=NODE_SCRIPT.read_bytes(),
            capture_output=True,
            timeout=30,
        )
        took = time.monotonic() - t
    finally:
        silent.close()
    doc = json.loads(p.stdout)
    rec = doc["instances"]["stuck"]
    assert p.returncode == 0 and "probe" not in doc
    assert "timed out" in rec["metrics"]["error"] and "timed out" in rec["metrics_2"]["error"]
    assert "text" not in rec["metrics"] and took < 3, took
