"""Deploy pre-flight on a real lab host: sizes read over SSH, ports from ss, then the simulator's log.

A sparse Qwen3-8B is made on the host.  Pre-flight (through a real Fleet,
facts from the real probe) refuses an instance that cannot fit, with vLLM's
numbers, and one whose port a foreign process (``python3 -m http.server`` in
a transient unit) listens on.  Then the simulator is started for two fitting
instances (0.11 and 0.33) as transient units named like deploy's units; the
predicted KV tokens are compared with the "GPU KV cache size" the simulator
logged, and a re-run of pre-flight while they run accepts them (their own
port and GPU memory) but refuses a new instance on a GPU they hold.
Everything started is stopped and the model removed.  Last, ``clusterctl deploy``
itself is refused by pre-flight with the numbers, before anything is written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from clusterctl.deploy.preflight.kvcheck import KvCheck, kv_prediction_error, logged_max_len_estimate, read_kv_checks
from clusterctl.deploy.preflight.checks import run_preflight
from clusterctl.fleet import Fleet
from clusterctl.inventory.loader import load_inventory
from clusterctl.inventory.model import Engine, GpuRef, Instance, Inventory, Model
from support.http import wait_healthy

REPO = Path(__file__).resolve().parents[2]
MODEL = "/models/pf-qwen3-8b"
AWQ_MODEL = "/models/pf-qwen3-8b-awq"
FOREIGN_UNIT = "pf-foreign-http"
FOREIGN_PORT = 8192


def _instances(
    host: str, rows: list[tuple[str, str, int | tuple[int, ...], int, dict]], model: str = "pf-qwen3-8b"
) -> dict[str, Instance]:
    return {
        n: Instance(
            name=n,
            model=model,
            engine=e,
            port=p,
            args=a,
            placement=tuple(GpuRef(host, i) for i in (g if isinstance(g, tuple) else (g,))),
        )
        for n, e, g, p, a in rows
    }


def _inventory(lab) -> Inventory:
    inv = load_inventory(str(lab.inventory))
    inv.models["pf-qwen3-8b"] = Model("pf-qwen3-8b", MODEL)
    inv.models["pf-qwen3-8b-awq"] = Model("pf-qwen3-8b-awq", AWQ_MODEL)
    inv.engines["pf-absent"] = Engine("pf-absent", "/opt/vllm-pf-absent/bin/vllm", "0.11.0")
    return inv


@pytest.fixture
def host(lab):
    name = lab.names[0]
    lab.run(name, f"vllm-sim make-model qwen3-8b {MODEL} --sparse", check=True, timeout=60)
    lab.run(name, f"vllm-sim make-model qwen3-8b {AWQ_MODEL} --sparse --quantization awq", check=True, timeout=60)
    lab.run(name, f"systemd-run --unit={FOREIGN_UNIT} --collect python3 -m http.server {FOREIGN_PORT}", check=True)
    yield name
    for unit in (FOREIGN_UNIT, "clusterctl-pf-big", "clusterctl-pf-a", "clusterctl-pf-b", "clusterctl-pf-c"):
        lab.run(name, f"systemctl stop {unit}; systemctl reset-failed {unit}", timeout=60)
    lab.run(name, f"rm -rf {MODEL} {AWQ_MODEL}", timeout=30)


def _start(lab, host: str, inst: Instance, engine_path: str, model: str = MODEL) -> None:
    args = " ".join(f"--{k}" if v is True else f"--{k} {v}" for k, v in inst.args.items())
    gpus = ",".join(str(g.index) for g in inst.placement)
    lab.run(
        host,
        f"systemd-run --unit=clusterctl-{inst.name} --collect --property=Type=exec "
        f"--setenv=VLLM_SIM_TIME_SCALE=0.05 --setenv=CUDA_VISIBLE_DEVICES={gpus} "
        f"{engine_path} serve {model} --port {inst.port} --tensor-parallel-size {inst.tp_size} {args}",
        check=True,
    )


def _wait_inactive(lab, host: str, unit: str, timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while lab.run(host, f"systemctl is-active {unit}").stdout.strip() in ("active", "activating"):
        assert time.monotonic() < deadline, f"{unit} still running"
        time.sleep(0.5)
    return lab.run(host, f"journalctl -u {unit} --no-pager -o cat", check=True).stdout


def test_preflight_refuses_then_predicts_the_logged_kv_cache(lab, host):
    inv = _inventory(lab)
    addr = lab.host(host).address
    wait_for_port = f"for i in $(seq 50); do ss -Htln | grep -q ':{FOREIGN_PORT} ' && exit 0; sleep 0.2; done; exit 1"
    lab.run(host, wait_for_port, check=True)
    insts = _instances(
        host,
        [
            ("pf-big", "vllm-0.11", 0, 8100, {"gpu-memory-utilization": 0.25, "max-model-len": 40960}),
            ("pf-clash", "vllm-0.11", 3, FOREIGN_PORT, {"max-model-len": 8192}),
            ("pf-a", "vllm-0.11", 1, 8101, {"gpu-memory-utilization": 0.5, "max-model-len": 8192}),
            ("pf-b", "vllm-0.33", 2, 8102, {"gpu-memory-utilization": 0.6, "max-model-len": 16384}),
            ("pf-noengine", "pf-absent", 6, 8106, {"max-model-len": 8192}),
        ],
    )
    # A 4-bit AWQ checkpoint over TP 2, eager, with an fp8 KV cache: the per-rank 0.11 lines.
    insts.update(
        _instances(
            host,
            [
                (
                    "pf-c",
                    "vllm-0.11",
                    (4, 5),
                    8104,
                    {"gpu-memory-utilization": 0.4, "kv-cache-dtype": "fp8", "enforce-eager": True},
                )
            ],
            model="pf-qwen3-8b-awq",
        )
    )
    with Fleet([inv.hosts[host]], connect_timeout=10, command_timeout=60) as fleet:
        events: list[str] = []
        rep = run_preflight(inv, insts, fleet, on_event=events.append)
    assert events and sorted(rep.refused) == ["pf-big", "pf-clash", "pf-noengine"]
    # An engine the host does not have: refused naming the host, the engine and its path.
    [missing] = [p for p in rep.row("pf-noengine").problems if p.check == "engine.missing"]
    assert (
        f"engine pf-absent (vLLM 0.11.0) is not installed on {host}: no /opt/vllm-pf-absent/bin/vllm" in missing.message
    )
    big = rep.row("pf-big")
    [kv] = [p for p in big.problems if p.check == "memory.kv"]
    # The sample's numbers (vLLM 0.11 on an H100): 2.87 GiB, estimated maximum 20880 (the lab's CUDA
    # total is estimated from NVML within 4 MiB, which may cost one 16-token block).
    assert kv.numbers["available_kv_gib"] == 2.87 and 20864 <= kv.numbers["estimated_max_model_len"] <= 20880
    assert kv.fit["gpu_memory_utilization"] == 0.3
    [port] = [p for p in rep.row("pf-clash").problems if p.check == "port.taken"]
    assert f"{FOREIGN_UNIT}.service" in port.message and "python3" in port.message
    assert rep.row("pf-a").ok and rep.row("pf-b").ok and rep.row("pf-a").weights_source == "safetensors"
    assert rep.row("pf-c").ok, rep.row("pf-c").to_json()

    # Forced anyway, the simulator refuses it with vLLM's message; compare the estimates.
    _start(lab, host, insts["pf-big"], "/opt/vllm-0.11/bin/vllm")
    journal = _wait_inactive(lab, host, "clusterctl-pf-big")
    assert "KV cache is needed, which is larger than the available KV cache memory (2.87 GiB)" in journal
    logged_est = logged_max_len_estimate(journal)
    assert logged_est is not None and abs(logged_est - kv.numbers["estimated_max_model_len"]) <= 16

    errors = {
        "pf-big (estimated max_model_len)": {"predicted": kv.numbers["estimated_max_model_len"], "logged": logged_est}
    }
    for name, path, model in (
        ("pf-a", "/opt/vllm-0.11/bin/vllm", MODEL),
        ("pf-b", "/opt/vllm-0.33/bin/vllm", MODEL),
        ("pf-c", "/opt/vllm-0.11/bin/vllm", AWQ_MODEL),
    ):
        _start(lab, host, insts[name], path, model)
        wait_healthy(lab, host, f"http://{addr}:{insts[name].port}/health", f"clusterctl-{name}", timeout=90)
    started = {n: v for n, v in rep.predictions().items() if n in ("pf-a", "pf-b", "pf-c")}
    with Fleet([inv.hosts[host]], connect_timeout=10, command_timeout=60) as fleet:
        checks = read_kv_checks(fleet, started)
    for name in ("pf-a", "pf-b", "pf-c"):
        check = checks[name]
        assert isinstance(check, KvCheck) and check.logged is not None and check.error_pct is not None, check
        journal = lab.run(host, f"journalctl -u clusterctl-{name} --no-pager -o cat", check=True).stdout
        assert kv_prediction_error(check.predicted, journal) == check  # the filtered journal says the same
        errors[name] = check.to_json()
        assert abs(check.error_pct) < 1.0, check
    print(f"KV prediction error: {errors}", file=sys.stderr)

    # Running: their own ports and GPU memory are theirs (a redeploy passes); a new instance on
    # pf-a's GPU is refused for lack of free memory.
    running = {n: insts[n] for n in ("pf-a", "pf-b", "pf-c")}
    late = _instances(host, [("pf-late", "vllm-0.11", 1, 8103, {"max-model-len": 8192})])
    with Fleet([inv.hosts[host]], connect_timeout=10, command_timeout=60) as fleet:
        rep2 = run_preflight(inv, running, fleet)
        rep3 = run_preflight(inv, late, fleet)
    assert rep2.ok and not any(r.problems for r in rep2.rows), rep2.to_json()
    [free] = [p for p in rep3.row("pf-late").problems if p.check == "gpu.free"]
    assert "clusterctl-pf-a.service" in free.message


def test_deploy_refuses_before_start_with_the_numbers(lab, host, tmp_path):
    """`clusterctl deploy` runs pre-flight first: refused, nothing written on the host."""
    doc = yaml.safe_load(Path(lab.inventory).read_text())
    doc["models"] = {"pf-qwen3-8b": {"path": MODEL, "version": "v1"}}
    doc["instances"] = {
        "pf-big": {
            "model": "pf-qwen3-8b",
            "engine": "vllm-0.11",
            "placement": f"{host}:0",
            "port": 8100,
            "args": {"gpu-memory-utilization": 0.25, "max-model-len": 40960},
        },
        "pf-clash": {
            "model": "pf-qwen3-8b",
            "engine": "vllm-0.11",
            "placement": f"{host}:3",
            "port": FOREIGN_PORT,
            "args": {"max-model-len": 8192},
        },
    }
    inv_path = tmp_path / "inventory.yaml"
    inv_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    lab.run(
        host,
        f"for i in $(seq 50); do ss -Htln | grep -q ':{FOREIGN_PORT} ' && exit 0; sleep 0.2; done; exit 1",
        check=True,
    )
    cp = subprocess.run(
        [
            sys.executable,
            "-m",
            "clusterctl.cli.main",
            "deploy",
            "-i",
            str(inv_path),
            "--hosts",
            host,
            "--state-dir",
            str(tmp_path / "state"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert cp.returncode == 3, cp.stdout + cp.stderr
    out = json.loads(cp.stdout)
    assert out["result"] == "refused" and sorted(out["preflight"]["refused"]) == ["pf-big", "pf-clash"]
    rows = {r["instance"]: r for r in out["preflight"]["instances"]}
    [kv] = [p for p in rows["pf-big"]["problems"] if p["check"] == "memory.kv"]
    assert kv["numbers"]["available_kv_gib"] == 2.87 and kv["numbers"]["needed_kv_gib"] == 5.62
    assert kv["fit"]["gpu_memory_utilization"] == 0.3
    assert [p["check"] for p in rows["pf-clash"]["problems"]] == ["port.taken"]
    units = lab.run(host, "ls /etc/systemd/system/ | grep -c '^clusterctl-pf-' || true").stdout.strip()
    assert units == "0"
