"""``clusterctl doctor`` GPU, OOM and TP-group checks on the lab.

The probe reads the simulated GPUs (fake NVML) and each host's kern.log over
SSH; the faults are injected as ``clusterctl lab inject`` does.  A test
inventory adds instances over the lab hosts (the lab inventory has none):
``grp-a`` on HOST1:[0-1], ``grp-b`` on HOST1:[2-3], ``grp-c`` on HOST2:[0-3].
``grp-d`` (HOST2:[4], TP 1) is started by hand as a transient systemd unit
running the vLLM simulator, to fail at start as vLLM does.  A hung engine and
sustained preemption under load are in test_doctor_serving.py.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml

from clusterctl.cli.main import main
from clusterctl.lab.hardware import faults

CHECKS = "gpu,oom,tp,serving"


@pytest.fixture(scope="module")
def inventory(lab, tmp_path_factory) -> Path:
    data = yaml.safe_load(Path(lab.inventory).read_text())
    h1, h2 = lab.names[0], lab.names[1]
    data["models"] = {
        "qwen3-8b": {
            "path": "/models/qwen3-8b",
            "arch": {
                "layers": 36,
                "hidden_size": 4096,
                "attention_heads": 32,
                "kv_heads": 8,
                "head_dim": 128,
                "vocab": 151936,
                "params": 8190735360,
                "dtype": "bfloat16",
            },
        }
    }
    engine = next(iter(data["engines"]))
    data["instances"] = {
        "grp-a": {
            "model": "qwen3-8b",
            "engine": engine,
            "placement": f"{h1}:[0-1]",
            "port": 8100,
            "args": {"max-model-len": 32768, "gpu-memory-utilization": 0.85},
        },
        "grp-b": {
            "model": "qwen3-8b",
            "engine": engine,
            "placement": f"{h1}:[2-3]",
            "port": 8101,
            "args": {"max-model-len": 32768, "gpu-memory-utilization": 0.85},
        },
        "grp-c": {
            "model": "qwen3-8b",
            "engine": engine,
            "placement": f"{h2}:[0-3]",
            "port": 8100,
            "args": {"max-model-len": 32768, "gpu-memory-utilization": 0.85},
        },
        "grp-d": {
            "model": "qwen3-8b",
            "engine": engine,
            "placement": f"{h2}:[4]",
            "port": 8102,
            "args": {"gpu-memory-utilization": 0.25},
        },
    }
    path = tmp_path_factory.mktemp("doctor") / "inventory.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def healed(healed_hosts: list[str]) -> list[str]:
    return healed_hosts


def doctor(inventory: Path, capsys, *extra: str) -> tuple[int, dict, float]:
    t0 = time.monotonic()
    checks = [] if "--checks" in extra else ["--checks", CHECKS]
    rc = main(["doctor", "all", "-i", str(inventory), "--json", *checks, "--interval", "1", "--sudo", *extra])
    took = time.monotonic() - t0
    return rc, json.loads(capsys.readouterr().out), took


def problems(rep: dict) -> list[dict]:
    return [f for f in rep["findings"] if f["severity"] != "OK"]


def find(rep: dict, check: str, host: str | None, subject: str) -> dict:
    hits = [f for f in rep["findings"] if f["check"] == check and f["host"] == host and f["subject"] == subject]
    assert len(hits) == 1, (check, host, subject, [f for f in rep["findings"] if f["check"] == check])
    return hits[0]


def clean_kernel_logs(lab) -> None:
    """Injected XIDs stay in kern.log after heal (as on a real node until it rotates)."""
    for name in lab.names:
        lab.run(name, ": > /var/log/kern.log", check=True)


def test_healthy_lab_reports_nothing_above_ok_within_seconds(lab, inventory, capsys, healed):
    clean_kernel_logs(lab)
    rc, rep, took = doctor(inventory, capsys)
    assert rc == 0 and problems(rep) == [], problems(rep)
    checked = {f["check"] for f in rep["findings"]}
    assert {
        "gpu.xid",
        "gpu.ecc",
        "gpu.remap",
        "gpu.lost",
        "gpu.inventory",
        "gpu.foreign",
        "tp.group",
        "oom.fit",
    } <= checked
    assert {f["host"] for f in rep["findings"] if f["check"] == "gpu.lost"} == set(lab.names)
    # --interval 1 plus the round trips; the bound is interval + 3 s
    assert took < 1 + 3 + 2, took


def test_xid_79_on_one_gpu_makes_its_tp_group_unavailable(lab, inventory, capsys, healed):
    victim = lab.names[0]
    healed.append(victim)
    faults.inject(lab.host_dir(victim), "xid", code=79, gpu=1)
    rc, rep, _ = doctor(inventory, capsys)
    assert rc == 2
    xid = find(rep, "gpu.xid", victim, "gpu:1")
    assert xid["severity"] == "CRIT" and re.match(
        r"gpu:1 \(0000:[0-9a-f]{2}:00\.0\): XID 79 GPU_HAS_FALLEN_OFF_THE_BUS", xid["message"]
    ), xid["message"]
    assert "power-cycle" in xid["action"]
    a = find(rep, "tp.group", None, "tp-group:grp-a")
    assert a["severity"] == "CRIT" and a["message"].startswith(f"UNAVAILABLE: member {victim}:1")
    assert find(rep, "tp.group", None, "tp-group:grp-b")["severity"] == "OK"
    assert find(rep, "tp.group", None, "tp-group:grp-c")["severity"] == "OK"


def test_lost_gpu_is_critical(lab, inventory, capsys, healed):
    victim = lab.names[1]
    healed.append(victim)
    faults.inject(lab.host_dir(victim), "gpu-lost", gpu=2, log=False)
    rc, rep, _ = doctor(inventory, capsys)
    assert rc == 2
    lost = find(rep, "gpu.lost", victim, "gpu:2")
    assert lost["severity"] == "CRIT" and "fallen off the bus" in lost["message"]
    assert find(rep, "tp.group", None, "tp-group:grp-c")["severity"] == "CRIT"


def test_remapped_rows_pending_is_a_warning_with_reset(lab, inventory, capsys, healed):
    victim = lab.names[-1]
    healed.append(victim)
    faults.inject(lab.host_dir(victim), "remap", gpu=5, pending=True)
    rc, rep, _ = doctor(inventory, capsys)
    remap = find(rep, "gpu.remap", victim, "gpu:5")
    assert remap["severity"] == "WARN" and "reset the GPU at the next maintenance window" in remap["action"]


def test_nvml_recovery_action_takes_the_tp_group_out(lab, inventory, capsys, healed):
    """The probe reads NVML_FI_DEV_GET_GPU_RECOVERY_ACTION from the (fake) driver, not the kernel log."""
    clean_kernel_logs(lab)  # the XID 79 test's line on this host would make grp-a UNAVAILABLE too
    victim = lab.names[0]
    healed.append(victim)
    faults.inject(lab.host_dir(victim), "recovery", gpu=3, action="drain-and-reset", log_xid=0)
    rc, rep, _ = doctor(inventory, capsys)
    assert rc == 2
    rec = find(rep, "gpu.recovery", victim, "gpu:3")
    assert rec["severity"] == "CRIT" and "drain_and_reset" in rec["message"] and "nvidia-smi -r" in rec["action"]
    assert find(rep, "tp.group", None, "tp-group:grp-b")["severity"] == "CRIT"
    assert find(rep, "tp.group", None, "tp-group:grp-a")["severity"] == "OK"


def test_a_gpu_not_registered_with_the_nvlink_fabric_is_critical(lab, inventory, capsys, healed):
    victim = lab.names[1]
    healed.append(victim)
    for gpu in range(4):
        faults.inject(lab.host_dir(victim), "fabric", gpu=gpu, state="completed")
    faults.inject(lab.host_dir(victim), "fabric", gpu=2, state="not-started")
    rc, rep, _ = doctor(inventory, capsys)
    assert rc == 2
    fab = find(rep, "gpu.fabric", victim, "gpu:2")
    assert fab["severity"] == "CRIT" and "not registered with the NVLink fabric (state not_started)" in fab["message"]
    assert not [
        f for f in rep["findings"] if f["check"] == "gpu.fabric" and f["severity"] != "OK" and f["subject"] != "gpu:2"
    ]
    assert find(rep, "tp.group", None, "tp-group:grp-c")["severity"] == "CRIT"


def test_foreign_process_on_an_instance_gpu(lab, inventory, capsys, healed):
    victim = lab.names[0]
    healed.append(victim)
    faults.inject(lab.host_dir(victim), "gpu-mem", gpu=2, gib=30.0, pid=0)
    rc, rep, _ = doctor(inventory, capsys)
    f = find(rep, "gpu.foreign", victim, "gpu:2")
    assert f["severity"] == "CRIT" and "not of instance grp-b" in f["message"]
    assert "holds 30.0 GiB on GPU 2" in f["action"]
    fit = [x for x in rep["findings"] if x["check"] == "oom.fit" and x["subject"] == "instance:grp-b"]
    assert fit and fit[0]["severity"] == "CRIT" and "will fail" in fit[0]["message"]
    assert find(rep, "tp.group", None, "tp-group:grp-b")["severity"] == "CRIT"
    assert find(rep, "tp.group", None, "tp-group:grp-c")["severity"] == "OK"  # other host, untouched


def test_collect_then_doctor_from_the_bundle_finds_the_same(lab, inventory, capsys, healed, tmp_path):
    victim = lab.names[-1]
    healed.append(victim)
    faults.inject(lab.host_dir(victim), "remap", gpu=6, pending=True)
    out = tmp_path / "triage.tar.gz"
    assert main(["collect", "all", "-i", str(inventory), "-o", str(out), "--interval", "0", "--sudo"]) == 0
    capsys.readouterr()
    rc, live, _ = doctor(inventory, capsys)
    assert main(["doctor", "--from", str(out), "--json", "--checks", CHECKS]) == rc
    offline = json.loads(capsys.readouterr().out)

    def key(rep: dict) -> set[tuple[str, str, str, str]]:
        return {(f["check"], f["severity"], f["host"] or "", f["subject"]) for f in rep["findings"]}

    assert key(offline) == key(live), sorted(key(offline) ^ key(live))
    assert find(offline, "gpu.remap", victim, "gpu:6")["severity"] == "WARN"
    import tarfile

    with tarfile.open(out) as tar:  # the probe's commands, verbatim, one file each
        names = tar.getnames()
        mine = [n.rsplit("/", 1)[-1] for n in names if f"/hosts/{victim}/commands/" in n]
        assert any(n.startswith("systemctl_list-units_clusterctl-") for n in mine), mine
        assert any(n.startswith("journalctl_-k") for n in mine), mine
        assert any("ethtool_-S_eth" in n for n in mine), mine  # by its full path
        assert "index.json" in mine


def test_instance_whose_max_model_len_does_not_fit_gets_the_cause_and_the_fix(lab, inventory, capsys, healed):
    host = lab.names[1]
    unit = "clusterctl-grp-d.service"
    lab.run(
        host,
        "test -e /models/qwen3-8b/config.json || vllm-sim make-model Qwen3-8B /models/qwen3-8b --sparse",
        check=True,
        timeout=120,
    )
    lab.run(
        host,
        f"systemctl reset-failed {unit} 2>/dev/null; systemd-run --unit {unit} "
        "--setenv=CUDA_VISIBLE_DEVICES=4 --setenv=VLLM_SIM_TIME_SCALE=0 /opt/vllm-0.11/bin/vllm serve "
        "/models/qwen3-8b --port 8102 --served-model-name qwen3-8b --gpu-memory-utilization 0.25",
        check=True,
    )
    try:
        deadline = time.monotonic() + 60
        while lab.run(host, f"systemctl is-failed --quiet {unit}").returncode != 0:
            assert time.monotonic() < deadline, lab.run(host, f"journalctl -u {unit} --no-pager | tail -20").stdout
            time.sleep(0.5)
        rc, rep, _ = doctor(inventory, capsys)
    finally:
        lab.run(host, f"systemctl stop {unit}; systemctl reset-failed {unit}")
    assert rc == 2
    cause = [f for f in rep["findings"] if f["check"] == "oom.cause" and f["subject"] == "instance:grp-d"]
    assert len(cause) == 1 and cause[0]["host"] == host and cause[0]["severity"] == "CRIT", cause
    assert cause[0]["message"].startswith("KV cache too small for max_model_len 40960")
    assert (
        "--max-model-len to at most" in cause[0]["action"]
        and "--gpu-memory-utilization from 0.25" in cause[0]["action"]
    )
    dead = [f for f in rep["findings"] if f["check"] == "serving.engine" and f["subject"] == "instance:grp-d"]
    assert dead and dead[0]["message"] == "the vLLM engine died during start-up"


def test_frozen_host_is_an_unknown_row_not_a_stalled_run(lab, inventory, capsys, healed):
    from clusterctl.lab import netfaults

    clean_kernel_logs(lab)
    frozen = lab.host(lab.names[1])  # owns grp-c and grp-d
    netfaults.freeze(lab.cfg, frozen)
    try:
        t0 = time.monotonic()
        rc = main(
            [
                "doctor",
                "all",
                "-i",
                str(inventory),
                "--json",
                "--checks",
                CHECKS,
                "--interval",
                "1",
                "--sudo",
                "--connect-timeout",
                "3",
            ]
        )
        took = time.monotonic() - t0
        rep = json.loads(capsys.readouterr().out)
    finally:
        netfaults.thaw(lab.cfg, frozen)
    assert took < 15, took
    assert rc == 3  # nothing worse than "could not check"
    row = find(rep, "host.reachable", frozen.name, "host")
    assert row["severity"] == "UNKNOWN" and row["message"].startswith("no facts:")
    assert find(rep, "tp.group", None, "tp-group:grp-c")["severity"] == "UNKNOWN"
    assert find(rep, "tp.group", None, "tp-group:grp-a")["severity"] == "OK"
    others = {f["host"] for f in rep["findings"] if f["check"] == "gpu.lost" and f["severity"] == "OK"}
    assert others == set(lab.names) - {frozen.name}


def test_learn_a_baseline_then_see_what_changed(lab, inventory, capsys, healed, tmp_path):
    clean_kernel_logs(lab)
    base = tmp_path / "baseline.yaml"
    assert main(["doctor", "all", "-i", str(inventory), "--learn", str(base), "--sudo", "--interval", "0"]) == 0
    assert f"{len(lab.names)} host(s) written" in capsys.readouterr().out
    victim = lab.names[2]
    healed.append(victim)
    faults.inject(lab.host_dir(victim), "pcie", gpu=7, width=4)
    rc, rep, _ = doctor(inventory, capsys, "--baseline", str(base), "--checks", "baseline")
    changed = [f for f in rep["findings"] if f["check"] == "gpu.baseline" and f["severity"] != "OK"]
    assert [
        (f["host"], f["subject"], re.sub(r"^gpu:7 \(0000:[0-9a-f]{2}:00\.0\): ", "", f["message"])) for f in changed
    ] == [(victim, "gpu:7", "PCIe x4, the baseline has x16")]
