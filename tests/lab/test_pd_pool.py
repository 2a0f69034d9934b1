"""A prefill/decode pool on two lab hosts serves through vllm-router; a pause storm slows its KV pulls.

The prefill and decode instances are the simulator (0.11 launcher) in transient
units on the first two lab hosts, started with the ``--kv-transfer-config`` and
environment clusterctl renders for their roles (``deploy/pd.py``); vllm-router
(scripts/install-vllm-router) runs on the control machine with the rendered
command line and reaches them over the lab bridge.  A pause storm on the
prefill host's RoCE priority (both data NICs) makes the decode instance's
KV pulls ten times slower, and doctor's ``pd.kv_transfer`` says so, naming
the pair and the path.  Cheap: sparse model, time scale 0.1, two requests.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import time

import pytest

from clusterctl.deploy import pd
from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.registry import AnalysisContext, run_analyzers
from clusterctl.diagnose.thresholds import load_thresholds
from clusterctl.inventory.loader import load_inventory, load_inventory_text
from clusterctl.lab.hardware import faults
from clusterctl.lab.vllm_sim.serve import free_port
from support.http import http, wait_healthy
from unit.vllm_sim.promparse import parse

MODEL = "/models/qwen3-8b"
UNIT = "vllm-sim-pd"
PORTS = {"prefill": 8401, "decode": 8402}


def _xfer(addr: str, port: int) -> tuple[float, float]:
    status, body = http(f"http://{addr}:{port}/metrics", None, 30)
    assert status == 200
    fams = parse(body.decode())
    return (sum(fams["vllm:nixl_xfer_time_seconds_sum"].values()),
            sum(fams["vllm:nixl_xfer_time_seconds_count"].values()))


def _plain(obj: object) -> dict:
    return {k: v for k, v in vars(obj).items() if v is not None and k != "location"}


@pytest.fixture
def pool(lab, healed_hosts):
    names = lab.names[:2]
    base = load_inventory(str(lab.inventory))
    hosts = {role: base.hosts[n] for role, n in zip(("prefill", "decode"), names)}
    router_port = free_port()
    text = "".join([
        "version: 1\n",
        "hosts:\n",
        *(f"  {h.name}: {{address: {h.address}, gpus: {json.dumps(_plain(h.gpus))}, nics: "
          f"{json.dumps([_plain(n) for n in h.nics])}}}\n"
          for h in hosts.values()),
        "engines:\n  sim: {path: /opt/vllm-0.11/bin/vllm, version: \"0.11.0\"}\n",
        f"models:\n  qwen3-8b: {{path: {MODEL}, served_name: qwen3-8b}}\n",
        "instances:\n",
        *(f"  q{role[0]}: {{model: qwen3-8b, engine: sim, placement: \"{h.name}:0\", port: {PORTS[role]}, "
          f"role: {role}}}\n" for role, h in hosts.items()),
        f"pd_pools:\n  qwen-pd: {{model: qwen3-8b, router: {{host: {hosts['prefill'].name}, "
        f"port: {router_port}}}}}\n"])
    inv = load_inventory_text(text, "pd-lab.yaml")
    for role, h in hosts.items():
        inst = inv.instances[f"q{role[0]}"]
        env = {"VLLM_SIM_TIME_SCALE": "0.1", "CUDA_VISIBLE_DEVICES": "0", **pd.kv_env(inv, inst, h)}
        setenv = " ".join(shlex.quote(f"--setenv={k}={v}") for k, v in env.items())
        kv = " ".join(shlex.quote(a) for a in pd.kv_args(inv, inst))
        lab.run(h.name, f"vllm-sim make-model qwen3-8b {MODEL} --sparse", check=True, timeout=60)
        lab.run(h.name, f"systemd-run --unit={UNIT} --collect --property=Type=exec {setenv} "
                        f"/opt/vllm-0.11/bin/vllm serve {MODEL} --served-model-name qwen3-8b --port {inst.port} "
                        f"--max-model-len 8192 {kv}", check=True)
    for role, h in hosts.items():
        wait_healthy(lab, h.name, f"http://{h.address}:{PORTS[role]}/health", UNIT, timeout=120)
    argv = pd.router_argv(inv, inv.pd_pools["qwen-pd"], inv.instances.values())
    argv[argv.index("--host") + 1] = "0.0.0.0"  # the router runs on this machine, not on the pool's host
    router = subprocess.Popen([*argv, "--log-level", "warning"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{router_port}"
    try:
        end = time.monotonic() + 60
        while True:
            try:
                if http(url + "/health", None, 5)[0] == 200:
                    break
            except OSError:
                pass
            assert router.poll() is None and time.monotonic() < end, "vllm-router did not become healthy"
            time.sleep(0.5)
        yield inv, hosts, url
    finally:
        router.terminate()
        router.wait(15)
        for h in hosts.values():
            lab.run(h.name, f"systemctl stop {UNIT}; systemctl reset-failed {UNIT}", timeout=60)


def test_pd_pool_serves_through_its_router_and_a_pause_storm_slows_its_kv_pulls(lab, pool, healed_hosts):
    inv, hosts, url = pool
    pre, dec = hosts["prefill"], hosts["decode"]
    prompt = " ".join(f"w{i}" for i in range(1500))
    status, body = http(url + "/v1/completions", {"model": "qwen3-8b", "prompt": prompt, "max_tokens": 8}, 120)
    assert status == 200 and json.loads(body)["usage"]["completion_tokens"] == 8
    s1, c1 = _xfer(dec.address, PORTS["decode"])
    assert c1 == 1 and s1 > 0

    healed_hosts.append(pre.name)
    for nic in ("eth2", "eth3"):
        faults.inject(lab.host_dir(pre.name), "pause-storm", nic=nic, priority=3, per_s=20000, paused=0.9)
    status, body = http(url + "/v1/completions", {"model": "qwen3-8b", "prompt": prompt, "max_tokens": 8}, 120)
    assert status == 200
    s2, c2 = _xfer(dec.address, PORTS["decode"])
    assert c2 == 2 and s2 - s1 == pytest.approx(10 * s1, rel=0.05)

    # doctor on one sample: the mean over both pulls (1x and 10x) is 5.5x what one 400 Gbit/s port takes
    metrics = http(f"http://{dec.address}:{PORTS['decode']}/metrics", None, 30)[1].decode()
    ctx = AnalysisContext(inventory=inv, facts={}, raw={dec.name: {"qd.metrics": metrics}},
                          thresholds=load_thresholds())
    [f] = run_analyzers(ctx, ["pd.kv_transfer"])
    assert f.severity is Severity.WARN, f
    assert "decode qd <- prefill qp (pool qwen-pd)" in f.message and pre.name in f.message and dec.name in f.message
