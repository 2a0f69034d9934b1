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
import roce_facts as R

from clusterctl.diagnose import nvsmi, sources
from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.instances import check_units
from clusterctl.diagnose.nodeprep import effective_limit
from clusterctl.diagnose.registry import AnalysisContext, run_analyzers
from clusterctl.diagnose.xid import check_xid
from clusterctl.node import collector
from clusterctl.probe.factgroups import (
    SCHEMA,
    GpusFact,
    HostFact,
    KernelLogFact,
    NicsFact,
    NodePrereqsFact,
    PeerMemory,
    RdmaPrereqsFact,
    ToolsFact,
    UnitsFact,
    schema_problem,
)

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


# ----------------------------------------------------------------- nics

ROCE = Path(__file__).resolve().parents[2] / "fixtures" / "diagnose" / "roce"


def _collected_nics() -> dict[str, object]:
    """``nics`` as the collector writes it for the sysfs tree of tests/fixtures/probe/sysroot_roce,
    with ens108np0's ``ethtool -S``, ``mlnx_qos`` and ``ethtool -a`` outputs (ConnectX-7 samples of
    tests/fixtures/diagnose/roce) put through the collector's own parsers."""
    errors: list[dict[str, str]] = []
    nics = collector.collect_nics(errors, root=str(FIXTURES / "sysroot_roce"))
    up = next(n for n in nics if n["netdev"] == "ens108np0")
    up["ethtool_stats"] = collector.parse_ethtool_stats((ROCE / "ethtool_S_eth2.txt").read_text())
    up["qos"] = collector.qos_from_outputs(
        collector.empty_qos(),
        mlnx_qos=(ROCE / "mlnx_qos_eth2_ok.txt").read_text(),
        ethtool_a=(ROCE / "ethtool_a_eth2_on.txt").read_text(),
    )
    return {"schema": 1, "collected_at": "2026-11-30T12:00:00+00:00", "nics": nics, "errors": errors}


def test_nics_group_from_the_collectors_sysfs_and_tool_readings() -> None:
    doc = _collected_nics()
    g = NicsFact.parse(doc)
    assert g.read and g.collected_at == "2026-11-30T12:00:00+00:00"
    assert [n.netdev for n in g.roce] == ["ens108np0", "ens109np0"]  # br0 has no RDMA port
    up = g.get("ens108np0")
    assert up is not None and up.rdma is not None and up.qos is not None
    assert (up.operstate, up.speed_mbps, up.mtu, up.numa_node, up.gbps) == ("up", 400000, 4200, 0, 400.0)
    r = up.rdma
    assert (r.device, r.port, r.state, r.link_layer, r.rate_gbps, r.fw_ver) == (
        "mlx5_0",
        1,
        "ACTIVE",
        "Ethernet",
        400.0,
        "28.39.1002",
    )
    assert r.hw_counters is not None and r.hw_counters["np_cnp_sent"] == 2418907
    assert "rx_icrc_encapsulated_unreadable" not in r.hw_counters  # unreadable: absent, not 0
    assert [(x.index, x.type) for x in r.gids][-1] == (3, "RoCE v2")
    assert up.ethtool_stats is not None and "rx_prio3_pause" in up.ethtool_stats
    q = up.qos
    assert (q.tool, q.trust, q.pfc_enabled, q.cable_len, q.dcbx) == ("mlnx_qos", "dscp", (3,), 7, "os")
    assert q.dscp2prio is not None and q.dscp2prio["26"] == 3 and q.prio2tc is not None and len(q.prio2tc) == 8
    assert q.global_pause is not None and (q.global_pause.rx, q.global_pause.tx) == (True, True)
    now = up.counters_now()
    assert now.t is None and now.hw_counters is r.hw_counters and now.ethtool_stats is up.ethtool_stats
    down = g.get("ens109np0")
    assert down is not None and down.rdma is not None and down.rdma.state == "DOWN" and down.qos is None


def test_dcb_readout_with_unreadable_priorities_keeps_their_slots() -> None:
    q = collector.qos_from_outputs(
        collector.empty_qos(),
        dcb_pfc=(ROCE / "dcb_pfc_show_eth2.txt").read_text(),
        dcb_app=(ROCE / "dcb_app_show_N_eth2.txt").read_text(),
    )
    q["prio2tc"] = [0, 0, None, 3, 0, 0, 0, 0]
    n = NicsFact.parse({"nics": [{"netdev": "eth2", "rdma": {"device": "mlx5_0"}, "qos": q}]}).nics[0]
    assert n.qos is not None and (n.qos.tool, n.qos.trust, n.qos.pfc_enabled) == ("dcb", "dscp", (3,))
    assert n.qos.prio2tc == (0, 0, None, 3, 0, 0, 0, 0) and n.qos.trust_source == "dcb app (DSCP entries present)"


def test_partial_and_malformed_nic_entries_read_as_absent_never_as_zero() -> None:
    doc = {
        "nics": [
            {
                "netdev": "eth2",
                "speed_mbps": None,
                "rdma": {"rate_gbps": 200, "counters": "x", "hw_counters": {"np_cnp_sent": "12", "a": 1}},
                "ethtool_stats": None,
                "ethtool_stats_reason": "ethtool not found",
                "qos": {"ecn": {"roce_np": {"3": 1, "4": 0, "x": 1}, "roce_rp": None}, "pfc_enabled": [3, "4"]},
                "samples": [{"t": 1.0, "ethtool_stats": {"rx_prio3_pause": 5}}, "junk"],
            },
            {"netdev": "", "rdma": {}},
            "junk",
        ]
    }
    g = NicsFact.parse(doc)
    assert [n.netdev for n in g.nics] == ["eth2", None] and [n.netdev for n in g.roce] == ["eth2"]
    n = g.nics[0]
    assert n.gbps == 200.0 and n.ethtool_stats is None and n.ethtool_stats_reason == "ethtool not found"
    assert n.rdma is not None and n.rdma.counters is None and n.rdma.hw_counters == {"a": 1}
    assert n.qos is not None and n.qos.ecn is not None and n.qos.ecn.roce_np == (3,) and n.qos.ecn.roce_rp == ()
    assert n.qos.pfc_enabled == (3,) and n.qos.trust is None and n.qos.global_pause is None
    assert len(n.samples) == 1 and n.samples[0].t == 1.0 and n.samples[0].hw_counters is None
    assert g.nics[1].rdma is None  # an empty RDMA section is no port
    assert NicsFact.parse({}).read and NicsFact.parse({}).nics == ()  # no section: no NICs (as before)
    for bad, why in (({"nics": {"eth2": {}}}, "malformed"), ({"schema": 2, "nics": []}, "facts schema 2")):
        g = NicsFact.parse(bad)
        assert not g.read and g.nics == () and why in g.reasons[0]


def test_an_unreadable_nic_section_is_unknown_for_the_roce_checks_never_ok() -> None:
    docs = {h: R.doc(h, [R.nic()]) for h in ("gpu01", "gpu02")}
    docs["gpu02"]["nics"] = {"eth2": docs["gpu02"]["nics"][0]}
    fs = run_analyzers(R.ctx(docs, R.inventory(2, per_leaf=2)), ["roce", "net.data"])
    on2 = {(f.check, f.severity) for f in fs if f.host == "gpu02"}
    assert on2 and all(sev == Severity.UNKNOWN for _, sev in on2), on2
    assert {"roce.qos", "net.data", "roce.pfc"} <= {c for c, _ in on2}
    assert any(f.host == "gpu01" and f.severity == Severity.OK for f in fs)


# ----------------------------------------------------------------- host, rdma_prereqs


def test_rdma_prereqs_group_from_the_collectors_proc_and_sysfs_reading(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    # /proc/modules lines as the kernel prints them (module, size, users, deps, state, address)
    (tmp_path / "proc/modules").write_text(
        "nvidia_peermem 16384 0 - Live 0x0000000000000000 (OE)\nmlx5_ib 442368 0 - Live 0x0000000000000000\n"
    )
    (tmp_path / "proc/cmdline").write_text("BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on quiet\n")
    for g, t in enumerate(["identity", "DMA-FQ", "DMA"]):
        (tmp_path / f"sys/kernel/iommu_groups/{g}").mkdir(parents=True)
        (tmp_path / f"sys/kernel/iommu_groups/{g}/type").write_text(t + "\n")
    section = collector.collect_rdma_prereqs({}, [], 1.0, [], root=str(tmp_path))
    p = RdmaPrereqsFact.parse({"schema": 1, "rdma_prereqs": section})
    assert p.peer_memory == PeerMemory(True, "nvidia_peermem", "/proc/modules", None)
    assert p.iommu is not None and (p.iommu.cmdline, p.iommu.groups, p.iommu.translated_groups) == (
        ("intel_iommu=on",),
        3,
        2,
    )
    assert p.acs == () and p.probe_memlock is not None and p.probe_memlock.soft_read and p.reasons == ()


def test_rdma_prereqs_and_host_partial_or_foreign_documents() -> None:
    old = RdmaPrereqsFact.parse({"rdma_prereqs": None})
    assert (old.peer_memory, old.acs, old.iommu, old.probe_memlock, old.reasons) == (None, None, None, None, ())
    doc = {
        "rdma_prereqs": {
            "peer_memory": {"loaded": None, "reason": "neither /proc/modules nor /sys/module readable"},
            "acs": [{"gpu": 0, "netdev": "eth2", "bridges": [{"pci_address": "0000:02:00.0", "redirect": None}, 7]}],
            "probe_memlock": {"hard_bytes": 65536},
        }
    }
    p = RdmaPrereqsFact.parse(doc)
    assert p.peer_memory is not None and p.peer_memory.loaded is None and "neither" in (p.peer_memory.reason or "")
    assert p.acs is not None and [(b.pci_address, b.redirect) for b in p.acs[0].bridges] == [("0000:02:00.0", None)]
    assert p.probe_memlock is not None and not p.probe_memlock.soft_read  # no soft limit reported: not "unlimited"
    foreign = RdmaPrereqsFact.parse({"schema": 2, **doc})
    assert foreign.peer_memory is None and "facts schema 2" in foreign.reasons[0]
    h = HostFact.parse(
        {"host": {"hostname": "gpu01", "boot_id": "b1", "disks": [{"mount": "/dev/shm", "total_bytes": None}, "x"]}}
    )
    shm = h.mount("/dev/shm")
    assert h.hostname == "gpu01" and shm is not None and shm.total_bytes is None and h.mount("/") is None
    assert (
        HostFact.parse({"host": "x"}).disks == ()
        and HostFact.parse({"schema": 2, "host": {"boot_id": "b"}}).boot_id is None
    )


# ----------------------------------------------------------------- gpus: processes, memory, bus ids

EVIDENCE = Path(__file__).resolve().parents[2] / "fixtures" / "evidence" / "nvidia"


def test_gpu_processes_and_bus_ids_from_nvidia_smi_and_nvml_shapes() -> None:
    # nvidia-smi -q of an H100 SXM node (tests/fixtures/evidence/nvidia/README.md), as doctor --from reads it
    g = GpusFact.parse({"gpus": nvsmi.parse_nvidia_smi_q((EVIDENCE / "nvidia-smi-q_H100SXMx8.txt").read_text())})
    d0 = g.devices[0]
    assert len(g.devices) == 8 and (d0.pci_address, d0.pci_bus_id) == ("0000:18:00.0", "00000000:18:00.0")
    assert d0.memory_used == 1048576 and d0.processes == ()
    # NVML's shape (docs/facts.md gpus.devices[].processes): a process the probe cannot see has no name/unit
    doc = {
        "gpus": {
            "devices": [
                {
                    "index": 2,
                    "pci_bus_id": "00000000:3B:00.0",
                    "memory_used": 1.5 * 2**30,
                    "processes": [
                        {"pid": 4242, "used_memory": 30 * 2**30, "name": "python3", "unit": "clusterctl-a.service"},
                        {"pid": 77, "used_memory": None, "name": None, "unit": None},
                        "junk",
                    ],
                }
            ]
        }
    }
    (d,) = GpusFact.parse(doc).devices
    assert [(p.pid, p.used_memory, p.name, p.unit) for p in d.processes] == [
        (4242, 30 * 2**30, "python3", "clusterctl-a.service"),
        (77, None, None, None),
    ]
    assert d.memory_used == 1.5 * 2**30 and d.pci_address is None
    ctx = AnalysisContext(inventory=None, facts={"h": doc})
    assert sources.bus_ids(ctx, "h") == {2: "0000:3b:00.0"} and sources.gpu_label(ctx, "h", 2) == "gpu:2 (0000:3b:00.0)"


def test_tools_group_from_the_collectors_lookup_and_older_documents() -> None:
    t = ToolsFact.parse({"schema": 1, "tools": collector.find_tools()})
    assert t.read and set(t.paths) == set(collector.TOOLS)
    assert (
        ToolsFact.parse({"tools": {"ib_write_bw": "/usr/bin/ib_write_bw"}}).path("ib_write_bw")
        == "/usr/bin/ib_write_bw"
    )
    assert ToolsFact.parse({"tools": {"ib_write_bw": None}}).path("ib_write_bw") is None
    assert not ToolsFact.parse({}).read and not ToolsFact.parse({"tools": None}).read
    assert "facts schema 2" in ToolsFact.parse({"schema": 2, "tools": {}}).reasons[0]


def test_node_prereqs_group_from_the_collectors_proc_and_etc_reading(tmp_path: Path) -> None:
    files = {
        "proc/sys/kernel/numa_balancing": "1\n",
        "proc/sys/net/ipv4/conf/all/arp_ignore": "0\n",
        "proc/sys/net/core/rmem_max": "212992\n",
        "etc/sysctl.d/90-clusterctl.conf": "# clusterctl node setup\nkernel.numa_balancing = 0\nnet.core.rmem_max=16777216\n",
        "etc/security/limits.conf": "*  soft  memlock  64  # default\n@admin hard nproc 10\n",
        "etc/security/limits.d/90-clusterctl-vllm.conf": "vllm - memlock unlimited\nvllm soft nofile 1048576\n",
        "etc/passwd": "root:x:0:0:root:/root:/bin/bash\nvllm:x:998:998::/var/lib/vllm:/usr/sbin/nologin\n",
    }
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    p = NodePrereqsFact.parse({"schema": 1, "node_prereqs": collector.collect_node_prereqs(str(tmp_path))})
    assert p.read and p.sysctl["kernel.numa_balancing"] == "1" and p.sysctl["net.core.rmem_max"] == "212992"
    assert p.sysctl["net.ipv4.conf.all.arp_announce"] is None  # no such /proc/sys file
    assert p.sysctl_dropin == {"kernel.numa_balancing": "0", "net.core.rmem_max": "16777216"}
    assert [(x.domain, x.type, x.item, x.value) for x in p.limits] == [
        ("*", "soft", "memlock", "64"),
        ("vllm", "-", "memlock", "unlimited"),
        ("vllm", "soft", "nofile", "1048576"),
    ]
    assert p.users == ("root", "vllm")
    assert effective_limit(p.limits, "vllm", "memlock") == {"soft": "unlimited", "hard": "unlimited"}
    failed = NodePrereqsFact.parse({"node_prereqs": None, "errors": [{"source": "node_prereqs", "reason": "boom"}]})
    assert not failed.read and failed.reasons == ("boom",) and failed.sysctl == {}
    assert not NodePrereqsFact.parse({"schema": 2, "node_prereqs": {"sysctl": {}}}).read


def test_gpu_facts_of_another_schema_are_unknown_for_every_gpu_check_never_ok() -> None:
    facts = G.healthy()
    facts["gpu02"]["schema"] = 2
    g = GpusFact.parse(facts["gpu02"])
    assert g.unreadable and "facts schema 2" in g.unreadable and not g.available and g.devices == ()
    fs = [f for f in run_analyzers(G.ctx(facts), ["gpu"]) if f.host == "gpu02"]
    assert fs and {f.severity for f in fs} == {Severity.UNKNOWN}, [(f.check, f.severity, f.message) for f in fs]
    assert any("facts schema 2" in f.message for f in fs)
    ok = [f for f in run_analyzers(G.ctx(G.healthy()), ["gpu"]) if f.host == "gpu02"]
    assert ok and all(f.severity == Severity.OK for f in ok)  # the same host, readable: all OK
