"""doctor --from: nvidia-smi topo -m, the recovery action and fabric of nvidia-smi -q, timed rdma statistic.

Real samples and where they come from: tests/fixtures/evidence/README.md.  Faults are made by editing
a real sample in the test (one field or one GPU's row), so the rest of the input stays real.
"""

from __future__ import annotations

import re
from pathlib import Path

from clusterctl.diagnose import evidence, nvsmi
from clusterctl.diagnose.bundle import context, read_bundle
from clusterctl.diagnose.doctor import diagnose
from clusterctl.diagnose.findings import Severity
from clusterctl.inventory.loader import load_inventory_text

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "evidence"
NV = FIX / "nvidia"
H100_Q = (NV / "nvidia-smi-q_H100SXMx8.txt").read_text()
NV8 = (NV / "topo-m_8gpu_NV8_2numa_nccl933.txt").read_text()
NV18 = (NV / "topo-m_H100x8_NV18_3numa_sglang13973.txt").read_text()


def run(path: Path, checks: list[str] | None = None, inventory=None):
    snap, _ = read_bundle(path)
    return diagnose(context(snap, inventory, {}), checks)


def bundle(tmp: Path, hosts: dict[str, dict[str, str]]) -> Path:
    for host, files in hosts.items():
        d = tmp / "b" / "hosts" / host / "commands"
        d.mkdir(parents=True)
        for name, text in files.items():
            (d / name).write_text(text)
    return tmp / "b"


def rows(findings, check: str, host: str | None = None):
    return sorted(
        (f.host, f.subject, f.severity.name) for f in findings if f.check == check and (host is None or f.host == host)
    )


# ------------------------------------------------- GPU Recovery Action, Fabric (-q)


def test_recovery_action_and_fabric_read_from_real_samples_as_the_probe_names_them():
    h100 = nvsmi.parse_nvidia_smi_q(H100_Q)  # R565, NVSwitch
    a100 = nvsmi.parse_nvidia_smi_q((NV / "nvidia-smi-q_A100SXMx4.txt").read_text())  # R555, no fabric
    r560 = nvsmi.parse_nvidia_smi_q((NV / "nvidia-smi-q_H100_560.txt").read_text())  # Reset Status only
    r470 = nvsmi.parse_nvidia_smi_q((NV / "nvidia-smi-q_GTX680.txt").read_text())
    assert {d["recovery_action"] for d in h100["devices"]} == {"none"}
    assert h100["devices"][0]["fabric"] == {
        "state": "completed",
        "status": 0,
        "clique_id": 0,
        "cluster_uuid": "00000000-0000-0000-0000-000000000000",
    }
    assert a100["devices"][0]["fabric"] is None and "N/A" in a100["devices"][0]["field_errors"]["fabric"]
    assert r560["devices"][0]["recovery_action"] == "none"  # "Reset Required: No" before the Recovery Action line
    assert {"gpu.recovery", "gpu.fabric"} <= nvsmi.covered_checks(h100) & nvsmi.covered_checks(a100)
    # R470 prints neither: the checks are not covered, so doctor says "not checked", never OK
    assert r470["devices"][0]["recovery_action"] is None
    assert not {"gpu.recovery", "gpu.fabric"} & nvsmi.covered_checks(r470)
    findings = run(NV / "nvidia-smi-q_GTX680.txt", ["gpu.recovery", "gpu.fabric"])
    assert {(f.check, f.severity) for f in findings if f.check.startswith("gpu.")} == {
        ("gpu.recovery", Severity.UNKNOWN),
        ("gpu.fabric", Severity.UNKNOWN),
    }


def test_healthy_hgx_sample_is_ok_for_recovery_and_fabric():
    findings = run(NV / "nvidia-smi-q_H100SXMx8.txt", ["gpu.recovery", "gpu.fabric"])
    assert rows(findings, "gpu.recovery") == [("local", "host", "OK")]
    assert rows(findings, "gpu.fabric") == [("local", "host", "OK")]


def test_a_real_h200_recovery_action_reset_is_crit(tmp_path):
    excerpt = (NV / "nvidia-smi-q_H200_570_recovery_reset_excerpt.txt").read_text()
    assert nvsmi.parse_nvidia_smi_q("GPU 00000000:18:00.0\n" + excerpt)["devices"][0]["recovery_action"] == "reset"
    # the same lines in place of GPU 2's block of the real 8-GPU sample
    blocks = H100_Q.split("\nGPU 0000")
    blocks[3] = re.sub(r"    GPU Reset Status\n(?:        .*\n)+    GPU Recovery Action .*\n", excerpt, blocks[3])
    (tmp_path / "q.txt").write_text("\nGPU 0000".join(blocks))
    findings = run(tmp_path / "q.txt", ["gpu.recovery"])
    assert rows(findings, "gpu.recovery") == [("local", "gpu:2", "CRIT")]
    assert "reset" in next(f.action for f in findings if f.check == "gpu.recovery").lower()


def test_a_gpu_not_registered_with_the_fabric_is_crit(tmp_path):
    text = (NV / "nvidia-smi-q_H100_560.txt").read_text()
    stuck = text.replace(
        "        State                             : Completed\n        Status                            : Success",
        "        State                             : In Progress\n        Status                            : N/A",
    )
    assert stuck != text
    (tmp_path / "q.txt").write_text(stuck)
    findings = run(tmp_path / "q.txt", ["gpu.fabric"])
    assert rows(findings, "gpu.fabric") == [("local", "gpu:0", "CRIT")]
    assert "in_progress" in next(f.message for f in findings if f.check == "gpu.fabric")


def test_reset_status_of_drivers_before_the_recovery_action_line():
    q = "GPU 00000000:18:00.0\n    GPU Reset Status\n        Reset Required : {}\n        Drain and Reset Recommended : {}\n"
    got = [
        nvsmi.parse_nvidia_smi_q(q.format(a, b))["devices"][0]["recovery_action"]
        for a, b in (("No", "N/A"), ("Yes", "No"), ("Yes", "Yes"))
    ]
    assert got == ["none", "reset", "drain_and_reset"]


# ------------------------------------------------------------------ topo -m


def test_topo_matrices_of_several_layouts_parse_by_their_header():
    nv18 = nvsmi.parse_topo_matrix(NV18)
    assert {g: v["numa_node"] for g, v in nv18["gpus"].items()} == {0: 0, 1: 0, 2: 0, 3: 1, 4: 2, 5: 2}
    assert nv18["pairs"][0] == {"gpus": [0, 1], "link": "NV18", "level": None, "nvlinks": 18}
    assert {(x["nic"], x["level"]) for x in nv18["gpu_nic"] if x["gpu"] == 3} >= {
        ("NIC4", "SINGLE"),
        ("NIC0", "SYSTEM"),
    }
    pcie = nvsmi.parse_topo_matrix((NV / "topo-m_8gpu_PCIe_SYS_DeepEP128.txt").read_text())
    assert {p["level"] for p in pcie["pairs"]} == {"SYSTEM"} and not any(p["nvlinks"] for p in pcie["pairs"])
    tabs = nvsmi.parse_topo_matrix((NV / "topo-m_2x5090_PHB_club3090-1140.txt").read_text())
    assert tabs["pairs"] == [{"gpus": [0, 1], "link": "PHB", "level": "HOSTBRIDGE", "nvlinks": None}]
    assert tabs["gpus"][1] == {"cpu_affinity": "0-63", "numa_node": 0} and tabs["nics"] == {}
    old = nvsmi.parse_topo_matrix((NV / "topo-m_8gpu_mlx4_old_k8s53497.txt").read_text())
    assert old["nics"] == {"mlx4_0": "mlx4_0"} and old["gpus"][0]["numa_node"] is None
    assert {(x["gpu"], x["level"]) for x in old["gpu_nic"]} >= {(0, "HOSTBRIDGE"), (4, "SYSTEM")}
    legend = nvsmi.parse_topo_matrix(
        "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\n"
        "GPU0\t X \tNV4\tPXB\t0-7\t0\nGPU1\tNV4\t X \tSYS\t8-15\t1\n"
        "NIC0\tPXB\tSYS\t X \n\nNIC Legend:\n\n  NIC0: mlx5_4\n"
    )
    assert legend["nics"] == {"NIC0": "mlx5_4"} and legend["gpu_nic"][1]["nic"] == "mlx5_4"
    for f in NV.glob("topo-m_*"):
        assert evidence.recognise(f.read_text())[0] == "nvidia-smi topo -m", f


def test_topo_fills_the_facts_the_probe_fills_from_nvml(tmp_path):
    b = bundle(
        tmp_path,
        {"gpu01": {"q.txt": H100_Q, "topo.txt": NV18, "ibdev2netdev.txt": "mlx5_0 port 1 ==> ens108np0 (Up)\n"}},
    )
    snap, _ = read_bundle(b)
    g = snap.facts["gpu01"]["gpus"]
    assert [d["numa_node"] for d in g["devices"]] == [0, 0, 0, 1, 2, 2, None, None]
    assert g["topology"][0] == {
        "gpus": [0, 1],
        "level": None,
        "nvlinks": 18,
        "reason": "NVLink (NV18): topo -m shows no PCIe level",
    }
    assert len(g["topology"]) == 27  # 28 pairs less GPU6-GPU7: their rows are not in the sample
    nics = {n["netdev"]: n for n in snap.facts["gpu01"]["nics"]}
    # no NIC legend in this sample: the columns are the devices' names
    assert nics["NIC0"]["numa_node"] == 0 and nics["NIC3"]["numa_node"] == 1 and nics["NIC8"]["numa_node"] is None
    assert nics["ens108np0"]["rdma"]["device"] == "mlx5_0"


def test_a_healthy_real_nvlink_box_has_no_nvlink_or_numa_problem(tmp_path):
    b = bundle(tmp_path, {h: {"q.txt": H100_Q, "topo.txt": NV8} for h in ("gpu01", "gpu02")})
    findings = run(b, ["gpu.nvlink", "host.rdma_prereqs"])
    assert not [f for f in findings if f.severity in (Severity.WARN, Severity.CRIT)], findings
    # topo -m shows NVLink counts, not link states or error counters: gpu.nvlink is not an all-clear
    assert rows(findings, "gpu.nvlink") == [("gpu01", "host", "UNKNOWN"), ("gpu02", "host", "UNKNOWN")]


def _drop_nvlinks(text: str, gpu: int) -> str:
    """The matrix with every NVLink of ``gpu`` shown as SYS (what a GPU whose links are down shows)."""
    out = []
    for line in text.splitlines():
        cells = line.split()
        if cells and re.match(r"GPU\d+$", cells[0]) and cells[1] != "GPU1":
            if cells[0] == f"GPU{gpu}":
                cells = ["SYS" if c.startswith("NV") else c for c in cells]
            elif cells[1 + gpu].startswith("NV"):
                cells[1 + gpu] = "SYS"
            line = "    ".join(cells)
        out.append(line)
    return "\n".join(out) + "\n"


def test_a_gpu_whose_nvlinks_are_gone_is_crit_by_the_other_hosts_of_its_model(tmp_path):
    b = bundle(
        tmp_path,
        {"gpu01": {"q.txt": H100_Q, "topo.txt": NV8}, "gpu02": {"q.txt": H100_Q, "topo.txt": _drop_nvlinks(NV8, 3)}},
    )
    findings = run(b, ["gpu.nvlink"])
    assert rows(findings, "gpu.nvlink", "gpu02") == [("gpu02", "gpu:3", "CRIT")]
    f = next(f for f in findings if f.host == "gpu02" and f.check == "gpu.nvlink")
    assert "GPU(s) 0,1,2,4,5,6,7" in f.message and "NV8" in f.message
    assert rows(findings, "gpu.nvlink", "gpu01") == [("gpu01", "host", "UNKNOWN")]


def test_no_nvlink_where_the_inventory_says_nvlink_is_crit(tmp_path):
    inv = load_inventory_text(
        "version: 1\nhosts:\n  gpu01:\n    address: 10.0.0.1\n    gpus: {count: 8, interconnect: nvlink}\n", "site.yaml"
    )
    pcie = (NV / "topo-m_8gpu_PCIe_SYS_DeepEP128.txt").read_text()
    b = bundle(tmp_path, {"gpu01": {"q.txt": H100_Q, "topo.txt": pcie}})
    crit = [f for f in run(b, ["gpu.nvlink"], inv) if f.severity == Severity.CRIT]
    assert crit and all("inventory says interconnect: nvlink" in f.message for f in crit)
    assert run(b, ["gpu.nvlink"]) and not [f for f in run(b, ["gpu.nvlink"]) if f.severity == Severity.CRIT]


def _keep_nics(text: str, keep: int) -> str:
    """The matrix with only its first ``keep`` NIC columns (the data NICs then all on one socket)."""
    lines = text.splitlines()
    names = lines[0].split()
    n_gpu = sum(1 for c in names if re.match(r"GPU\d+$", c))
    n_nic = sum(1 for c in names if re.match(r"NIC\d+$", c))
    out = [re.sub(r"\s+NIC(\d+)", lambda m: m.group(0) if int(m.group(1)) < keep else "", lines[0])]
    for line in lines[1:]:
        cells = line.split()
        out.append("    ".join(cells[: 1 + n_gpu + keep] + cells[1 + n_gpu + n_nic :]))
    return "\n".join(out) + "\n"


def test_gpus_whose_nearest_data_nic_is_across_the_socket_warn(tmp_path):
    b = bundle(tmp_path, {"gpu01": {"q.txt": H100_Q, "topo.txt": NV18}})
    assert not [f for f in run(b, ["host.rdma_prereqs"]) if f.severity == Severity.WARN]
    b = bundle(tmp_path / "x", {"gpu01": {"q.txt": H100_Q, "topo.txt": _keep_nics(NV18, 3)}})
    warn = [f for f in run(b, ["host.rdma_prereqs"]) if f.severity == Severity.WARN]
    assert sorted(f.subject for f in warn) == ["gpu:3", "gpu:4", "gpu:5"]
    assert "NUMA node 1" in next(f.message for f in warn if f.subject == "gpu:3")


def test_topo_without_a_gpu_listing_is_noted_not_used(tmp_path):
    d = tmp_path / "gpu01"
    d.mkdir()
    (d / "topo.txt").write_text(NV18)
    snap, _ = read_bundle(d)
    seen = {s["path"]: s for s in snap.inputs["gpu01"]}
    assert seen["topo.txt"]["kind"] == "nvidia-smi topo -m" and "not used" in seen["topo.txt"]["note"]


# --------------------------------------------------------- rdma statistic x2


def test_two_timed_rdma_statistic_outputs_give_rates(tmp_path):
    base = (FIX / "roce" / "rdma_statistic_show_mlx5x4.txt").read_text()
    later = base.replace(
        "np_cnp_sent 0 rx_icrc_encapsulated 0\nlink mlx5_1/1",
        "np_cnp_sent 900000 rx_icrc_encapsulated 0\nlink mlx5_1/1",
        1,
    )
    later = later.replace("packet_seq_err 0", "packet_seq_err 5000", 1)
    b = bundle(
        tmp_path,
        {
            "gpu01": {
                "rdma_statistic_show.1.txt": "Tue Dec  1 10:00:00 UTC 2026\n" + base,
                "rdma_statistic_show.2.txt": "2026-12-01T10:00:10Z\n" + later,
                "ibdev2netdev.txt": (FIX / "roce" / "ibdev2netdev_mlx5x4.txt").read_text(),
            }
        },
    )
    snap, _ = read_bundle(b)
    nic = next(n for n in snap.facts["gpu01"]["nics"] if n["netdev"] == "eth01")
    assert [s["t_sysfs"] for s in nic["samples"]] == [1796119200.0, 1796119210.0]
    assert nic["samples"][1]["hw_counters"]["np_cnp_sent"] == 900000
    findings = diagnose(context(snap, None, {}), ["roce.congestion", "roce.transport"])
    assert ("gpu01", "nic:eth01", "WARN") in rows(findings, "roce.congestion")
    assert ("gpu01", "nic:eth01", "CRIT") in rows(findings, "roce.transport")
    # the other ports did not move: no finding for them, and the host is checked (not "not checked")
    assert not [f for f in findings if f.subject in ("nic:eth03", "nic:eth04") and f.severity >= Severity.WARN]
    assert not [f for f in findings if "not checked" in f.message]


def test_rdma_statistic_outputs_without_times_give_no_rates(tmp_path):
    base = (FIX / "roce" / "rdma_statistic_show_mlx5x4.txt").read_text()
    b = bundle(tmp_path, {"gpu01": {"a.txt": base, "b.txt": base}})
    snap, _ = read_bundle(b)
    assert all(not n.get("samples") for n in snap.facts["gpu01"]["nics"])
    assert any("without a time" in s["note"] for s in snap.inputs["gpu01"])
    findings = diagnose(context(snap, None, {}), ["roce.congestion"])
    assert findings and all(f.severity == Severity.UNKNOWN for f in findings if f.check == "roce.congestion")


def test_json_rdma_statistic_after_a_date_line_is_a_sample(tmp_path):
    one = '[{"ifindex":2,"ifname":"mlx5_0","port":1,"np_cnp_sent":%d,"packet_seq_err":0}]\n'
    b = bundle(tmp_path, {"gpu01": {"s1.json": "1796119200\n" + one % 0, "s2.json": "1796119205\n" + one % 500000}})
    snap, _ = read_bundle(b)
    assert {s["kind"] for s in snap.inputs["gpu01"]} == {"rdma statistic"}
    nic = snap.facts["gpu01"]["nics"][0]
    assert nic["netdev"] == "mlx5_0" and [s["hw_counters"]["np_cnp_sent"] for s in nic["samples"]] == [0, 500000]


def test_an_inventory_data_nic_the_raw_outputs_do_not_show_is_not_checked_not_missing(tmp_path):
    """Before: `the inventory's data NIC does not exist on this host` (CRIT) for a host whose
    bundle had only nvidia-smi -q."""
    inv = load_inventory_text(
        "version: 1\nhosts:\n  gpu01:\n    address: 10.0.0.1\n    gpus: {count: 8}\n"
        "    nics:\n      - {netdev: eth2, role: data, speed_gbps: 200}\n",
        "site.yaml",
    )
    b = bundle(tmp_path, {"gpu01": {"q.txt": H100_Q}})
    assert rows(run(b, ["net.data"], inv), "net.data") == [("gpu01", "host", "UNKNOWN")]
    b = bundle(tmp_path / "x", {"gpu01": {"q.txt": H100_Q, "ibdev2netdev.txt": "mlx5_0 port 1 ==> eth2 (Down)\n"}})
    assert rows(run(b, ["net.data"], inv), "net.data") == [("gpu01", "nic:eth2", "CRIT")]  # shown, and down
