"""The collector's readers of /proc, /sys/class, systemctl and the kernel log,
on fixture trees and on stand-in programs put first on PATH."""

from __future__ import annotations

import json
import os
import shutil
import stat
import time
from pathlib import Path

from clusterctl.node import collector

from probe_fakes import FIXTURES, collector_args

ROCE = str(FIXTURES / "sysroot_roce")


# -- host -------------------------------------------------------------------


def test_meminfo_in_bytes():
    m = collector.parse_meminfo((FIXTURES / "proc" / "meminfo").read_text())
    assert m["total"] == 2113459180 * 1024
    assert m["available"] == 2056412900 * 1024
    assert m["hugepages_total"] == 0 and m["hugepage_size"] == 2048 * 1024


def test_cpuinfo_model_count_sockets():
    c = collector.parse_cpuinfo((FIXTURES / "proc" / "cpuinfo").read_text())
    assert c == {"model": "Intel(R) Xeon(R) Platinum 8480+", "count": 4, "sockets": 2}


def test_mounts_skip_pseudo_keep_shm_unescape_and_dedupe():
    mounts = collector.parse_mounts((FIXTURES / "proc" / "mounts").read_text())
    assert [m["mount"] for m in mounts] == ["/", "/dev/shm", "/models", "/mnt/model weights"]
    assert mounts[3]["fstype"] == "nfs4"


def test_os_release_unquotes():
    r = collector.parse_os_release('NAME="Debian GNU/Linux"\nVERSION_ID="12"\n# c\nID=debian\nBAD LINE\n')
    assert r == {"NAME": "Debian GNU/Linux", "VERSION_ID": "12", "ID": "debian"}


def test_disk_usage_reads_and_reports_missing_mount(tmp_path):
    errors: list = []
    out = collector.disk_usage(
        [
            {"device": "x", "mount": str(tmp_path), "fstype": "ext4"},
            {"device": "y", "mount": str(tmp_path / "gone"), "fstype": "nfs4"},
        ],
        timeout=5,
        errors=errors,
    )
    assert out[0]["total_bytes"] > 0 and out[0]["avail_bytes"] <= out[0]["total_bytes"]
    assert out[1]["total_bytes"] is None
    assert errors == [{"source": "disks", "reason": f"statvfs {tmp_path / 'gone'}: No such file or directory"}]


def test_timed_caller_abandons_a_hung_call_and_keeps_working():
    caller = collector.TimedCaller(0.2)
    t0 = time.monotonic()
    try:
        caller.call(time.sleep, 5)
    except collector.CallTimeout:
        pass
    else:
        raise AssertionError("no timeout")
    assert time.monotonic() - t0 < 1
    assert caller.call(lambda x: x * 2, 21) == 42  # a fresh worker
    try:
        caller.call(int, "x")
    except ValueError:
        pass
    else:
        raise AssertionError("the call's exception must reach the caller")


def test_gpu_process_owner_from_proc(tmp_path):
    d = tmp_path / "proc" / "4242"
    d.mkdir(parents=True)
    (d / "comm").write_text("python3\n")
    (d / "cgroup").write_text(
        "12:memory:/system.slice/clusterctl-vllm-qwen-a.service\n"
        "1:name=systemd:/system.slice/clusterctl-vllm-qwen-a.service\n"
    )
    assert collector.process_owner(4242, root=str(tmp_path)) == {
        "name": "python3",
        "unit": "clusterctl-vllm-qwen-a.service",
    }
    assert collector.process_owner(4243, root=str(tmp_path)) == {"name": None, "unit": None}


# -- NICs and RDMA -------------------------------------------------------------


def nics_by_name():
    errors: list = []
    nics = collector.collect_nics(errors, root=ROCE)
    assert errors == []
    return {n["netdev"]: n for n in nics}, nics


def test_nics_and_rdma_ports_from_sysfs_tree():
    by, nics = nics_by_name()
    assert "lo" not in by
    up = by["ens108np0"]
    assert up["operstate"] == "up" and up["speed_mbps"] == 400000 and up["mtu"] == 4200
    assert up["numa_node"] == 0 and up["rx_bytes"] == 412345678901 and up["rx_dropped"] == 3
    r = up["rdma"]
    assert (r["device"], r["port"], r["state"], r["phys_state"]) == ("mlx5_0", 1, "ACTIVE", "LinkUp")
    assert r["link_layer"] == "Ethernet" and r["rate_gbps"] == 400.0 and r["fw_ver"] == "28.39.1002"
    assert r["hw_counters"]["np_cnp_sent"] == 2418907
    assert r["counters"]["port_xmit_data"] == 102662518309661
    assert "rx_icrc_encapsulated_unreadable" not in r["hw_counters"]  # unreadable: absent, not 0
    assert [g["index"] for g in r["gids"]] == [0, 1, 2, 3]  # the all-zero GID 4 is skipped
    assert r["gids"][3] == {
        "index": 3,
        "gid": "0000:0000:0000:0000:0000:ffff:0a4d:000b",
        "type": "RoCE v2",
        "netdev": "ens108np0",
    }


def test_down_link_matched_through_pci_device():
    by, _ = nics_by_name()
    down = by["ens109np0"]
    assert down["speed_mbps"] is None  # the kernel reports -1 for an unknown speed
    assert down["rdma"]["device"] == "mlx5_1" and down["rdma"]["state"] == "DOWN"
    assert down["rdma"]["counters"] is None  # no counters directory


def test_virtual_nic_and_rdma_port_without_netdev():
    by, nics = nics_by_name()
    assert by["br0"]["rdma"] is None and by["br0"]["numa_node"] is None and by["br0"]["speed_mbps"] is None
    orphan = nics[-1]
    assert orphan["netdev"] is None and orphan["rdma"]["device"] == "mlx5_9"
    assert orphan["rdma"]["link_layer"] == "InfiniBand" and orphan["rdma"]["state"] == "INIT"
    assert set(orphan) == set(by["br0"])


def test_no_sysfs_is_an_error_entry(tmp_path):
    errors: list = []
    assert collector.collect_nics(errors, root=str(tmp_path)) == []
    assert errors[0]["source"] == "nics" and "/sys/class/net" in errors[0]["reason"]


def test_nearest_nic_by_shared_pci_ancestor(tmp_path):
    dev = tmp_path / "sys" / "devices" / "pci0000:16" / "0000:16:01.0"
    (dev / "0000:18:00.0").mkdir(parents=True)  # GPU under the same switch
    (dev / "0000:19:00.0").mkdir(parents=True)  # NIC under the same switch
    far = tmp_path / "sys" / "devices" / "pci0000:97" / "0000:97:01.0" / "0000:98:00.0"
    far.mkdir(parents=True)
    (tmp_path / "sys" / "bus" / "pci" / "devices").mkdir(parents=True)
    (tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:18:00.0").symlink_to(dev / "0000:18:00.0")
    for name, target in (("eth2", dev / "0000:19:00.0"), ("eth3", far)):
        (tmp_path / "sys" / "class" / "net" / name).mkdir(parents=True)
        (tmp_path / "sys" / "class" / "net" / name / "device").symlink_to(target)
    gpus = {"devices": [{"pci_address": "0000:18:00.0", "nearest_nics": None}]}
    nics = [{"netdev": "eth2", "pci_address": "0000:19:00.0"}, {"netdev": "eth3", "pci_address": "0000:98:00.0"}]
    collector.nearest_nics(gpus, nics, root=str(tmp_path))
    assert gpus["devices"][0]["nearest_nics"] == {"netdevs": ["eth2"], "depth": 2}


# -- systemd units (a stand-in systemctl first on PATH) ---------------------------


def fake_program(bindir: Path, name: str, script: str) -> None:
    bindir.mkdir(exist_ok=True)
    p = bindir / name
    p.write_text("#!/bin/sh\n" + script)
    p.chmod(p.stat().st_mode | stat.S_IXUSR)


SHOW = """Id=clusterctl-vllm-qwen-a.service
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

Id=clusterctl-vllm-qwen-b.service
LoadState=loaded
ActiveState=failed
SubState=failed
UnitFileState=disabled
Result=exit-code
NRestarts=5
MainPID=0
ExecMainStatus=1
StateChangeTimestamp=Mon 2026-11-30 10:05:00 UTC
StateChangeTimestampMonotonic=400000000
"""


def test_units_from_systemctl(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    (tmp_path / "show.txt").write_text(SHOW)
    fake_program(
        bindir,
        "systemctl",
        f"""
case "$1" in
  list-units) printf '%s\\n' 'clusterctl-vllm-qwen-a.service loaded active running vLLM qwen-a' \
    '● clusterctl-vllm-qwen-b.service loaded failed failed vLLM qwen-b';;
  list-unit-files) printf '%s\\n' 'clusterctl-vllm-qwen-a.service enabled enabled';;
  show) echo "$@" > {tmp_path}/show-args; cat {tmp_path}/show.txt;;
  *) exit 9;;
esac
""",
    )
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    errors: list = []
    units = collector.collect_units(collector_args(), errors, uptime_s=1000.0)
    assert errors == []
    assert [u["unit"] for u in units] == ["clusterctl-vllm-qwen-a.service", "clusterctl-vllm-qwen-b.service"]
    a, b = units
    assert (a["active_state"], a["sub_state"], a["restarts"], a["main_pid"]) == ("active", "running", 2, 4242)
    assert (b["active_state"], b["result"], b["restarts"], b["main_pid"]) == ("failed", "exit-code", 5, None)
    # since = boot time + monotonic stamp: booted 1000 s ago, changed 100 s after boot
    since = collector.datetime.datetime.fromisoformat(a["since"]).timestamp()
    assert abs(since - (time.time() - 900)) < 5
    assert "NRestarts" in (tmp_path / "show-args").read_text()
    assert (tmp_path / "show-args").read_text().count("clusterctl-vllm-qwen-a.service") == 1


def test_no_systemd_is_recorded(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    fake_program(
        bindir, "systemctl", "echo 'System has not been booted with systemd as init system (PID 1).' >&2; exit 1\n"
    )
    monkeypatch.setenv("PATH", str(bindir))
    errors: list = []
    assert collector.collect_units(collector_args(), errors, None) is None
    assert errors == [
        {
            "source": "units",
            "reason": "systemctl list-units failed (rc 1): System has not "
            "been booted with systemd as init system (PID 1).",
        }
    ]


def test_no_matching_units_is_an_empty_list(tmp_path, monkeypatch):
    # list-units prints nothing and exits 0; list-unit-files exits 1 without a word
    fake_program(tmp_path / "bin", "systemctl", 'case "$1" in list-unit-files) exit 1;; *) exit 0;; esac\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    errors: list = []
    assert collector.collect_units(collector_args(), errors, None) == []
    assert errors == []


def test_missing_systemctl_is_recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    errors: list = []
    assert collector.collect_units(collector_args(), errors, None) is None
    assert errors == [{"source": "units", "reason": "systemctl not found"}]


def test_hung_systemctl_times_out(tmp_path, monkeypatch):
    fake_program(tmp_path / "bin", "systemctl", "exec sleep 30\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    errors: list = []
    t0 = time.monotonic()
    assert collector.collect_units(collector_args(cmd_timeout=0.3), errors, None) is None
    assert time.monotonic() - t0 < 3
    assert errors == [{"source": "units", "reason": "systemctl list-units timed out after 0.3 s"}]


# -- kernel log --------------------------------------------------------------------


def kern_root(tmp_path: Path, text: str | None = None) -> Path:
    log = tmp_path / "var" / "log"
    log.mkdir(parents=True)
    if text is None:
        shutil.copy(FIXTURES / "kern.log", log / "kern.log")
    else:
        (log / "kern.log").write_text(text)
    return log / "kern.log"


def test_kern_log_tail_then_continue_from_cursor(tmp_path):
    path = kern_root(tmp_path)
    first = collector.read_kern_log(None, 5, [], root=str(tmp_path))
    assert first["source"] == "/var/log/kern.log"
    assert len(first["lines"]) == 5 and "NVRM: Xid (PCI:0000:86:00): 63" in first["lines"][-1]["text"]
    assert first["lines"][0]["time"] is not None
    with path.open("a") as f:
        f.write("2026-11-30T11:00:00+00:00 gpu01 kernel: mlx5_core 0000:19:00.0 ens108np0: Link down\n")
        f.write("2026-11-30T11:00:01+00:00 gpu01 kernel: half a li")  # still being written
    nxt = collector.read_kern_log(first["cursor"], 100, [], root=str(tmp_path))
    assert [x["text"].split("kernel: ")[1] for x in nxt["lines"]] == ["mlx5_core 0000:19:00.0 ens108np0: Link down"]
    with path.open("a") as f:
        f.write("ne\n")
    last = collector.read_kern_log(nxt["cursor"], 100, [], root=str(tmp_path))
    assert [x["text"][-11:] for x in last["lines"]] == ["half a line"]
    assert last["rotated"] is False


def test_kern_log_cursor_survives_rotation(tmp_path):
    path = kern_root(tmp_path, "old 1\n")
    cur = collector.read_kern_log(None, 10, [], root=str(tmp_path))["cursor"]
    with path.open("a") as f:
        f.write("old 2\n")
    path.rename(path.with_name("kern.log.1"))
    path.write_text("new 1\n")
    got = collector.read_kern_log(cur, 10, [], root=str(tmp_path))
    assert [x["text"] for x in got["lines"]] == ["old 2", "new 1"]
    assert got["rotated"] is True


def test_kern_log_max_lines_truncates_and_continues(tmp_path):
    kern_root(tmp_path, "".join(f"line {i}\n" for i in range(10)))
    cursor = "file:/var/log/kern.log:%d:0" % os.stat(tmp_path / "var/log/kern.log").st_ino
    a = collector.read_kern_log(cursor, 4, [], root=str(tmp_path))
    assert [x["text"] for x in a["lines"]] == ["line 0", "line 1", "line 2", "line 3"] and a["truncated"]
    b = collector.read_kern_log(a["cursor"], 100, [], root=str(tmp_path))
    assert b["lines"][0]["text"] == "line 4" and not b["truncated"]


def test_unreadable_kern_log_is_recorded(tmp_path):
    kern_root(tmp_path).chmod(0)
    errors: list = []
    if os.geteuid() == 0:  # root reads anything: use a directory instead
        (tmp_path / "var/log/kern.log").unlink()
        (tmp_path / "var/log/kern.log").mkdir()
    assert collector.read_kern_log(None, 10, errors, root=str(tmp_path)) is None
    assert errors[0]["source"] == "kernel_log" and "/var/log/kern.log" in errors[0]["reason"]


def journal_entries() -> str:
    rows = [
        {
            "__CURSOR": "s=abc;i=1",
            "__REALTIME_TIMESTAMP": "1764496800000000",
            "_BOOT_ID": "b1",
            "PRIORITY": "3",
            "MESSAGE": "NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=python3, DBE",
        },
        {
            "__CURSOR": "s=abc;i=2",
            "__REALTIME_TIMESTAMP": "1764496801000000",
            "_BOOT_ID": "b1",
            "PRIORITY": "4",
            "MESSAGE": [78, 86, 82, 77, 255],
        },
    ]
    return "\n".join(json.dumps(r) for r in rows) + "\n"


def test_journal_used_when_it_has_kernel_messages(tmp_path, monkeypatch):
    (tmp_path / "j.json").write_text(journal_entries())
    fake_program(tmp_path / "bin", "journalctl", f'echo "$@" > {tmp_path}/args; cat {tmp_path}/j.json\n')
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    errors: list = []
    got = collector.collect_kernel_log(collector_args(kernel_log_cursor="s=abc;i=0"), errors, root=str(tmp_path))
    assert errors == []
    assert got["source"] == "journal" and got["cursor"] == "s=abc;i=2"
    assert got["lines"][0] == {
        "time": 1764496800.0,
        "boot_id": "b1",
        "priority": 3,
        "text": "NVRM: Xid (PCI:0000:3b:00): 48, pid=1, name=python3, DBE",
    }
    assert got["lines"][1]["text"] == "NVRM\ufffd"
    assert (tmp_path / "args").read_text().split() == ["-k", "-o", "json", "--no-pager", "--after-cursor", "s=abc;i=0"]


def test_journal_without_kernel_messages_falls_back_to_kern_log(tmp_path, monkeypatch):
    fake_program(tmp_path / "bin", "journalctl", "exit 0\n")  # a container's journal: no kernel transport
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    kern_root(tmp_path)
    got = collector.collect_kernel_log(collector_args(), [], root=str(tmp_path))
    assert got["source"] == "/var/log/kern.log" and len(got["lines"]) == 12
    assert got["cursor"].startswith("file:/var/log/kern.log:")


def test_no_kernel_log_anywhere(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no journalctl
    errors: list = []
    got = collector.collect_kernel_log(collector_args(), errors, root=str(tmp_path))
    assert got == {"source": None, "cursor": None, "truncated": False, "rotated": False, "lines": []}
    assert errors[0]["source"] == "kernel_log" and errors[0]["reason"].startswith("no kernel log")
