"""doctor --from on the raw outputs operators have (real samples: tests/fixtures/evidence/README.md)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterctl.diagnose import evidence, nvsmi
from clusterctl.diagnose.bundle import context, read_bundle
from clusterctl.diagnose.doctor import diagnose
from clusterctl.diagnose.findings import Severity, exit_code
from clusterctl.node import collector

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "evidence"
NV = FIX / "nvidia"
ROOT = Path(__file__).resolve().parents[3]
HEALTHY = [
    "nvidia-smi-q_GTX680.txt",
    "nvidia-smi-q_GTX1050Ti.txt",
    "nvidia-smi-q_V100_x8.txt",
    "nvidia-smi-q_H100SXMx8.txt",
    "nvidia-smi-q_H100_560.txt",
]
GPU_CHECKS = "gpu.nvml,gpu.lost,gpu.ecc,gpu.remap,gpu.retired,gpu.clocks,gpu.pcie,gpu.thermal,gpu.persistence"


def doctor(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "clusterctl.cli.main", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def run(path: Path, checks: list[str] | None = None, host: str | None = None):
    snap, _ = read_bundle(path, host=host)
    return diagnose(context(snap, None, {}), checks)


# ------------------------------------------------------------ NVIDIA formats


def test_three_driver_generations_parse_by_label():
    r470 = nvsmi.parse_nvidia_smi_q((NV / "nvidia-smi-q_GTX680.txt").read_text())
    r550 = nvsmi.parse_nvidia_smi_q((NV / "nvidia-smi-q_V100_x8.txt").read_text())
    r555 = nvsmi.parse_nvidia_smi_q((NV / "nvidia-smi-q_A100SXMx4.txt").read_text())
    assert [g["driver_version"] for g in (r470, r550, r555)] == ["470.256.02", "550.127.05", "555.42.02"]
    old = r470["devices"][0]
    # R470 on a GeForce: everything N/A is "not supported", never 0
    assert old["clocks_event_reasons"] is None and "N/A" in old["field_errors"]["clocks_event_reasons"]
    assert old["ecc"]["volatile"] == {"corrected": None, "uncorrected": None}
    assert old["remapped_rows"] is None and old["retired_pages"] is None
    # Volta: retired pages with values, no row remapper
    v100 = r550["devices"]
    assert len(v100) == 8 and all(d["remapped_rows"] is None for d in v100)
    assert sorted(d["retired_pages"]["single_bit_ecc"] for d in v100) == [0] * 7 + [1]
    assert v100[0]["clocks_event_reasons"] == {"mask": "0x1", "active": ["gpu_idle"]}
    # Ampere: remapped rows, the pending one found on its GPU
    a100 = r555["devices"]
    assert [d["remapped_rows"]["pending"] for d in a100] == [False, True, False, False]
    assert a100[1]["ecc"]["volatile"] == {"corrected": 353, "uncorrected": 0}
    assert a100[1]["pci_address"] == "0000:9e:00.0" and a100[1]["memory_total"] == 81920 * 2**20


def test_old_clocks_throttle_reasons_block_reads_like_the_new_one():
    block = (NV / "nvidia-smi-q_grep_clocks_throttle_reasons.txt").read_text()
    g = nvsmi.parse_nvidia_smi_q("GPU 00000000:3B:00.0\n" + block)
    assert g["devices"][0]["clocks_event_reasons"] == {"mask": "0x1", "active": ["gpu_idle"]}
    hot = block.replace("HW Thermal Slowdown     : Not Active", "HW Thermal Slowdown     : Active")
    g = nvsmi.parse_nvidia_smi_q("GPU 00000000:3B:00.0\n" + hot)
    assert g["devices"][0]["clocks_event_reasons"]["active"] == ["gpu_idle", "hw_thermal_slowdown"]


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_real_samples_give_no_crit(name):
    findings = run(NV / name)
    assert not [f for f in findings if f.severity == Severity.CRIT], [f for f in findings if f.severity >= 2]
    gpu = [f for f in findings if f.check in ("gpu.ecc", "gpu.remap", "gpu.retired", "gpu.nvml")]
    assert gpu and all(f.severity == Severity.OK for f in gpu)


@pytest.mark.parametrize(
    "name,gpu", [("nvidia-smi-q_A100SXMx4.txt", "gpu:1"), ("nvidia-smi-q_A100_510_remap_pending.txt", "gpu:0")]
)
def test_a_pending_row_remap_in_a_real_sample_is_found(name, gpu):
    findings = run(NV / name, GPU_CHECKS.split(","))
    remap = [f for f in findings if f.check == "gpu.remap" and f.severity != Severity.OK]
    assert [(f.subject, f.severity) for f in remap] == [(gpu, Severity.WARN)]


def test_lost_gpu_lines_become_lost_devices():
    text = (
        "Unable to determine the device handle for GPU 0000:2B:00.0: GPU is lost.  Reboot the system "
        "to recover this GPU\n" + (NV / "nvidia-smi-q_H100_560.txt").read_text()
    )
    g = nvsmi.parse_nvidia_smi_q(text)
    lost = [d for d in g["devices"] if d["lost"]]
    assert (
        len(lost) == 1
        and lost[0]["pci_address"] == "0000:2b:00.0"
        and "GPU is lost" in lost[0]["field_errors"]["device"]
    )


def test_query_gpu_csv_and_nvlink_and_dcgm():
    csv = (
        "index, name, pci.bus_id, temperature.gpu, ecc.errors.uncorrected.volatile.total, "
        "clocks_event_reasons.active, pcie.link.width.current, pcie.link.width.max\n"
        "0, NVIDIA H100 80GB HBM3, 00000000:18:00.0, 34, 0, 0x0000000000000001, 16, 16\n"
        "1, NVIDIA H100 80GB HBM3, 00000000:2A:00.0, 36, 2, 0x0000000000000040, 8, 16\n"
    )
    g = nvsmi.parse_query_gpu_csv(csv)
    assert g["devices"][1]["ecc"]["volatile"]["uncorrected"] == 2
    assert g["devices"][1]["clocks_event_reasons"]["active"] == ["hw_thermal_slowdown"]
    assert nvsmi.covered_checks(g) >= {"gpu.ecc", "gpu.clocks", "gpu.pcie", "gpu.thermal"}
    assert "gpu.remap" not in nvsmi.covered_checks(g)  # the query did not ask: not an OK
    links = nvsmi.parse_nvlink(
        "GPU 0: NVIDIA H100 (UUID: GPU-1)\n\t Link 0: 26.562 GB/s\n\t Link 1: <inactive>\n"
        "GPU 0: NVIDIA H100 (UUID: GPU-1)\n\t Link 0: Replay Errors: 3\n"
    )
    assert [(lk["link"], lk["state"], lk["errors"]["replay"]) for lk in links[0]] == [
        (0, "active", 3),
        (1, "inactive", None),
    ]
    diag = nvsmi.parse_dcgmi_diag(
        {
            "DCGM GPU Diagnostic": {
                "version": "3.3.5",
                "test_categories": [
                    {
                        "category": "Hardware",
                        "tests": [
                            {
                                "name": "Memory",
                                "results": [
                                    {"gpu_id": "3", "status": "Fail", "warnings": [{"warning": "DBE detected"}]}
                                ],
                            }
                        ],
                    }
                ],
            }
        }
    )
    assert diag["results"] == [
        {"category": "Hardware", "test": "Memory", "gpu": "3", "status": "Fail", "messages": ["DBE detected"]}
    ]


# ----------------------------------------------------------- NIC tools, one path


def test_real_mlnx_qos_and_inbox_dcb_read_through_the_probe_functions():
    q = (FIX / "roce" / "mlnx_qos_eth4_trust_dscp_pfc3.txt").read_text()
    d = (FIX / "roce" / "dcb_pfc_show_eth0_prio67.txt").read_text()
    assert evidence.recognise(q)[0] == "mlnx_qos" and evidence.recognise(d)[0] == "dcb pfc"
    a = collector.qos_from_outputs(collector.empty_qos(), mlnx_qos=q)
    b = collector.qos_from_outputs(collector.empty_qos(), dcb_pfc=d)
    assert (a["tool"], a["trust"], a["pfc_enabled"], a["dscp2prio"]["26"]) == ("mlnx_qos", "dscp", [3], 3)
    assert (b["tool"], b["pfc_enabled"]) == ("dcb", [6, 7])
    ev = evidence.host_evidence([("mlnx_qos_-i_eth4.txt", q.encode())])
    nic = ev.facts["nics"][0]
    assert nic["netdev"] == "eth4" and nic["qos"]["pfc_enabled"] == a["pfc_enabled"]


def test_other_nic_tool_outputs_parse():
    assert collector.parse_ibdev2netdev("mlx5_0 port 1 ==> ens108np0 (Up)\n") == [
        {"device": "mlx5_0", "port": 1, "netdev": "ens108np0", "state": "Up"}
    ]
    ecn = collector.parse_ecn_dump(
        "/sys/class/net/eth2/ecn/roce_np/enable/3:1\n"
        "/sys/class/net/eth2/ecn/roce_rp/enable/3:1\n"
        "/sys/class/net/eth2/ecn/roce_np/cnp_dscp:48\n"
    )
    assert ecn == {"roce_np": {"3": 1}, "roce_rp": {"3": 1}, "cnp_dscp": 48, "cnp_802p_prio": None}
    assert collector.parse_traffic_class("Global tclass=106\n") == (106, None)
    assert collector.parse_dcb_ets("prio-tc 0:0 1:0 2:0 3:3 4:0 5:0 6:0 7:0\n")[3] == 3
    stats = collector.parse_rdma_statistic('[{"ifindex":2,"ifname":"mlx5_0","port":1,"np_cnp_sent":5}]')
    assert stats == {("mlx5_0", 1): {"np_cnp_sent": 5}}
    gids = collector.parse_show_gids(
        "DEV\tPORT\tINDEX\tGID\t\tIPv4\tVER\tDEV\n"
        "mlx5_0\t1\t3\t0000:0000:0000:0000:0000:ffff:c0a8:d3f2\t192.168.211.242\tv2\trdma0\n"
    )
    assert gids[0]["type"] == "RoCE v2" and gids[0]["netdev"] == "rdma0"


# ----------------------------------------------------------------- the issue


def _storm(base: str, add: int) -> str:
    out = []
    for line in base.splitlines():
        name, sep, value = line.rpartition(": ")
        if sep and name.strip() in ("rx_prio3_pause", "tx_pause_storm_error_events", "rx_prio3_pause_duration"):
            line = f"{name}: {int(value) + add}"
        out.append(line)
    return "\n".join(out) + "\n"


def test_a_bundle_of_raw_outputs_with_a_pause_storm_is_not_an_all_clear(tmp_path):
    """The issue's case: hosts/NAME/commands/ holds only raw outputs; before, exit 0 "OK: no findings"."""
    c = tmp_path / "b" / "hosts" / "gpu07" / "commands"
    c.mkdir(parents=True)
    base = (FIX / "roce" / "ethtool_S_eth2_synthetic.txt").read_text()
    (c / "ethtool_-S_eth2.1.txt").write_text("2026-12-01T10:00:00Z\n" + base)
    (c / "ethtool_-S_eth2.2.txt").write_text("2026-12-01T10:00:10Z\n" + _storm(base, 5_000_000))
    (c / "mlnx_qos_-i_eth2.txt").write_text((FIX / "roce" / "mlnx_qos_eth4_trust_dscp_pfc3.txt").read_text())
    (c / "nvidia-smi-q.txt").write_text((NV / "nvidia-smi-q_H100_560.txt").read_text())
    r = doctor("--from", str(tmp_path / "b"), "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr
    assert any(f["check"] == "roce.pfc" and f["severity"] == "CRIT" and f["host"] == "gpu07" for f in doc["findings"])
    # what had no input says so
    assert any(
        f["check"] == "gpu.xid" and f["severity"] == "UNKNOWN" and "not checked" in f["message"]
        for f in doc["findings"]
    )


def test_one_sample_gives_what_one_sample_can(tmp_path):
    d = tmp_path / "gpu08"
    d.mkdir()
    (d / "ethtool_S_eth2.txt").write_text((FIX / "roce" / "ethtool_S_eth2_synthetic.txt").read_text())
    findings = run(d)
    roce = [f for f in findings if f.check.startswith("roce.") and f.check != "roce.qos"]
    assert roce and all(f.severity == Severity.UNKNOWN for f in roce)
    assert any("no counter samples" in f.message for f in roce)


def test_healthy_single_file_is_unknown_for_what_it_cannot_show_and_ok_for_what_it_shows(tmp_path):
    r = doctor("--from", str(NV / "nvidia-smi-q_H100_560.txt"), "--json")
    doc = json.loads(r.stdout)
    assert r.returncode in (1, 3)  # roce, xid, serving...: not checked (and this GPU logged 6 PCIe replays: WARN)
    by = {f["check"]: f["severity"] for f in doc["findings"]}
    assert by["gpu.ecc"] == "OK" and by["gpu.remap"] == "OK" and by["roce.pfc"] == "UNKNOWN"
    assert by["gpu.nvlink"] == "UNKNOWN"  # -q does not show NVLink: never OK on data never seen
    r = doctor("--from", str(NV / "nvidia-smi-q_H100_560.txt"), "--checks", "gpu.ecc,gpu.remap,gpu.retired,gpu.clocks")
    assert r.returncode == 0, r.stdout


def test_nvidia_bug_report_is_split_and_its_parts_analysed(tmp_path):
    sep = "\n____________________________________________\n\n"
    text = (
        "nvidia-bug-report.sh will now collect information about your\nsystem and create the file "
        "'nvidia-bug-report.log.gz' in the current directory.\n" + sep + "*** /proc/cmdline\n"
        "BOOT_IMAGE=/vmlinuz ro quiet\n"
        + sep
        + "/usr/bin/nvidia-smi -q\n\n"
        + (NV / "nvidia-smi-q_A100SXMx4.txt").read_text()
        + sep
        + "dmesg:\n\n"
        + (NV / "dmesg_xid_mixed_synthetic.log").read_text()
        + sep
    )
    f = tmp_path / "nvidia-bug-report.log.gz"
    f.write_bytes(gzip.compress(text.encode()))
    r = doctor("--from", str(f), "--host", "gpu09", "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 2
    checks = {(x["check"], x["severity"]) for x in doc["findings"] if x["host"] == "gpu09"}
    assert ("gpu.remap", "WARN") in checks and ("gpu.xid", "CRIT") in checks
    r = doctor("--from", str(f), "--explain-input", "--json")
    seen = json.loads(r.stdout)["hosts"]["local"]
    assert {s["kind"] for s in seen} >= {"nvidia-bug-report", "nvidia-smi -q", "kernel log"}


def test_explain_input_says_what_was_read_and_why_not(tmp_path):
    d = tmp_path / "node"
    d.mkdir()
    (d / "ethtool.txt").write_text((FIX / "roce" / "ethtool_S_eth2_synthetic.txt").read_text())
    (d / "notes.txt").write_text("the node rebooted twice\n")
    (d / "core").write_bytes(b"\x7fELF\0\0\0binary")
    r = doctor("--from", str(d), "--explain-input", "--json")
    assert r.returncode == 0, r.stderr
    seen = {s["path"]: s for s in json.loads(r.stdout)["hosts"]["node"]}
    assert seen["ethtool.txt"]["kind"] == "ethtool -S"
    assert seen["notes.txt"]["kind"] is None and "not an output" in seen["notes.txt"]["note"]
    assert seen["core"]["kind"] is None and "binary" in seen["core"]["note"]
    r = doctor("--from", str(d), "--explain-input")
    assert "ethtool -S" in r.stdout and "ignored" in r.stdout


def test_a_host_with_nothing_usable_is_unknown_and_says_what_was_missing(tmp_path):
    b = tmp_path / "b" / "hosts"
    (b / "gpu01").mkdir(parents=True)
    (b / "gpu01" / "notes.txt").write_text("nothing useful\n")
    (b / "gpu02").mkdir()
    (b / "gpu02" / "dmesg.txt").write_text((NV / "dmesg_xid_mixed_synthetic.log").read_text())
    snap, _ = read_bundle(tmp_path / "b")
    assert "gpu01" in snap.missing and "notes.txt" in snap.missing["gpu01"]
    findings = diagnose(context(snap, None, {}))
    assert any(f.host == "gpu01" and f.check == "host.reachable" and f.severity == Severity.UNKNOWN for f in findings)
    assert exit_code(findings) == 2


def test_command_index_times_make_two_samples_rates(tmp_path):
    """A hand-made bundle in collect's layout: commands/ plus index.json with each command's start time."""
    c = tmp_path / "b" / "hosts" / "gpu10" / "commands"
    c.mkdir(parents=True)
    base = (FIX / "roce" / "ethtool_S_eth2_synthetic.txt").read_text()
    (c / "a.txt").write_text(base)
    (c / "b.txt").write_text(_storm(base, 5_000_000))
    (c / "index.json").write_text(
        json.dumps(
            [
                {"file": "a.txt", "argv": ["ethtool", "-S", "ens1f0np0"], "started_at": "2026-12-01T10:00:00Z"},
                {"file": "b.txt", "argv": ["ethtool", "-S", "ens1f0np0"], "started_at": "2026-12-01T10:00:05Z"},
            ]
        )
    )
    snap, _ = read_bundle(tmp_path / "b")
    nic = snap.facts["gpu10"]["nics"][0]
    assert nic["netdev"] == "ens1f0np0" and [s["t"] for s in nic["samples"]] == [1796119200.0, 1796119205.0]
    findings = diagnose(context(snap, None, {}), ["roce.pfc"])
    assert any(f.check == "roce.pfc" and f.severity == Severity.CRIT for f in findings)


def test_real_mlnx_qos_of_a_lossless_port_is_not_a_qos_problem(tmp_path):
    d = tmp_path / "gpu11"
    d.mkdir()
    (d / "mlnx_qos_-i_eth4.txt").write_text((FIX / "roce" / "mlnx_qos_eth4_trust_dscp_pfc3.txt").read_text())
    findings = [f for f in run(d, ["roce.qos"]) if f.check == "roce.qos"]
    assert findings and not [f for f in findings if f.severity == Severity.CRIT], findings


def test_bug_report_of_many_gzip_members_in_a_directory_is_read_whole(tmp_path):
    """nvidia-bug-report.sh pipes each section through gzip and appends it: one file, many members."""
    sep = "____________________________________________\n\n"
    parts = [
        sep + "Start of NVIDIA bug report log file.\n\nnvidia-bug-report.sh Version: 31831145\n\n",
        sep
        + "*** /var/log/kern.log\n*** ls: -rw-r----- 1 syslog adm 1 Dec  1 10:00 /var/log/kern.log\n"
        + (NV / "dmesg_xid_mixed_synthetic.log").read_text(),
        sep + "/usr/bin/nvidia-smi --query\n\n" + (NV / "nvidia-smi-q_V100_x8.txt").read_text(),
    ]
    d = tmp_path / "gpu12"
    d.mkdir()
    (d / "nvidia-bug-report.log.gz").write_bytes(b"".join(gzip.compress(p.encode()) for p in parts))
    snap, _ = read_bundle(d)
    kinds = {s["kind"] for s in snap.inputs["gpu12"]}
    assert {"nvidia-bug-report", "kernel log", "nvidia-smi -q"} <= kinds
    assert len(snap.facts["gpu12"]["gpus"]["devices"]) == 8


def test_dcgm4_layout_and_a_failed_test_is_crit(tmp_path):
    doc = {
        "DCGM Diagnostic": {
            "test_categories": [
                {
                    "category": "Integration",
                    "tests": [
                        {
                            "name": "pcie",
                            "results": [
                                {
                                    "entity_group": "GPU",
                                    "entity_id": 2,
                                    "status": "Fail",
                                    "warnings": [{"error_id": 26, "message": "PCIe replay rate exceeded"}],
                                },
                                {"entity_group": "GPU", "entity_id": 3, "status": "Pass"},
                            ],
                        }
                    ],
                }
            ]
        }
    }
    d = tmp_path / "gpu13"
    d.mkdir()
    (d / "dcgm.json").write_text(json.dumps(doc))
    findings = [f for f in run(d, ["gpu.dcgm"]) if f.check == "gpu.dcgm"]
    assert [(f.subject, f.severity) for f in findings] == [("gpu:2", Severity.CRIT)]
    assert "PCIe replay rate exceeded" in findings[0].message


def test_journal_json_kernel_log_reads_like_the_live_probe(tmp_path):
    lines = [
        {
            "__REALTIME_TIMESTAMP": "1764583200000000",
            "_TRANSPORT": "kernel",
            "PRIORITY": "4",
            "MESSAGE": "NVRM: Xid (PCI:0000:3b:00): 79, pid=0, GPU has fallen off the bus.",
        },
        {
            "__REALTIME_TIMESTAMP": "1764583201000000",
            "_TRANSPORT": "kernel",
            "PRIORITY": "6",
            "MESSAGE": "mlx5_core 0000:19:00.0 eth2: Link up",
        },
    ]
    d = tmp_path / "gpu14"
    d.mkdir()
    (d / "journal-k.json").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    snap, _ = read_bundle(d)
    assert snap.raw["gpu14"]["kernel.log"].splitlines()[0] == lines[0]["MESSAGE"]
    r = doctor("--from", str(d), "--checks", "xid", "--json")
    assert r.returncode == 2 and any(
        f["check"] == "gpu.xid" and "79" in f["message"] for f in json.loads(r.stdout)["findings"]
    ), r.stdout[-1500:]
