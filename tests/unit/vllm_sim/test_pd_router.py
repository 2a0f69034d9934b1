"""A prefill/decode pool serves through the real vllm-router, started with the command clusterctl renders.

vllm-router is installed by scripts/install-vllm-router (install-deps runs it);
the simulators play a 1P:1D pool on loopback.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

from clusterctl.deploy.units import pd
from clusterctl.inventory.loader import load_inventory_text
from clusterctl.lab.hardware import provision_host
from clusterctl.lab.hardware.host import hw_dir
from clusterctl.lab.vllm_sim.serve import free_port

from .conftest import READY
from .promparse import parse

ROUTER = os.environ.get("CLUSTERCTL_VLLM_ROUTER", pd.ROUTER_BIN)


def _inventory(p_port: int, d_port: int, r_port: int, model: Path, m_port: int = 0):
    return load_inventory_text(
        f"""\
version: 1
defaults:
  gpus: {{count: 2, model: H100-SXM5-80GB, memory_gib: 80, interconnect: nvlink}}
hosts:
  p1: {{address: 127.0.0.1}}
  d1: {{address: 127.0.0.1}}
engines:
  sim: {{path: /usr/local/bin/vllm, version: "0.11.0"}}
models:
  qwen3-8b: {{path: {model}, served_name: qwen3-8b}}
instances:
  qp1: {{model: qwen3-8b, engine: sim, placement: "p1:0", port: {p_port}, role: prefill}}
  qd1: {{model: qwen3-8b, engine: sim, placement: "d1:0", port: {d_port}, role: decode}}
pd_pools:
  qwen-pd: {{model: qwen3-8b, router: {{host: p1, port: {r_port}, metrics_port: {m_port or free_port()}}}}}
""",
        "pd.yaml",
    )


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, json.loads(r.read())


def test_pd_pool_serves_through_vllm_router(start_sim, models, tmp_path: Path) -> None:
    assert Path(ROUTER).exists(), f"{ROUTER} missing: run scripts/install-vllm-router"
    p_port, d_port, r_port, m_port = free_port(), free_port(), free_port(), free_port()
    inv = _inventory(p_port, d_port, r_port, models["qwen3-8b"], m_port)
    sims = {}
    for name, port in (("qp1", p_port), ("qd1", d_port)):
        provision_host(tmp_path / name, name, 0, 2, "H100-SXM5-80GB", "mlnx")
        argv = pd.kv_args(inv, inv.instances[name])
        sims[name] = start_sim(
            hw_dir(tmp_path / name) / "nvml.json",
            models["qwen3-8b"],
            *argv,
            "--served-model-name",
            "qwen3-8b",
            port=port,
        )
    for s in sims.values():
        assert s.wait_for(READY), s.log
    argv = pd.router_argv(inv, inv.pd_pools["qwen-pd"], inv.instances.values(), binary=ROUTER)
    router = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{r_port}"
        end = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < end and router.poll() is None, "vllm-router did not become healthy"
            time.sleep(0.2)
        prompt = " ".join(f"w{i}" for i in range(500))
        # ignore_eos (a vLLM sampling field the router passes through): the token counts below are exact,
        # not cut short by an end-of-sequence token the decode instance may draw (about 1 in 43 per token).
        code, out = _post(
            url + "/v1/completions", {"model": "qwen3-8b", "prompt": prompt, "max_tokens": 8, "ignore_eos": True}
        )
        assert code == 200 and out["usage"]["completion_tokens"] == 8
        code, chat = _post(
            url + "/v1/chat/completions",
            {
                "model": "qwen3-8b",
                "max_tokens": 4,
                "ignore_eos": True,
                "messages": [{"role": "user", "content": prompt}],
            },
        )
        assert code == 200 and chat["choices"][0]["message"]["content"]
        # The prefill instance produced one token per request, the decode one pulled the KV twice.
        pre = parse(sims["qp1"].get("/metrics")[1].decode())
        dec = parse(sims["qd1"].get("/metrics")[1].decode())
        assert sum(pre["vllm:generation_tokens_total"].values()) == 2
        assert sum(dec["vllm:nixl_xfer_time_seconds_count"].values()) == 2
        assert sum(dec["vllm:generation_tokens_total"].values()) == 12
        # its Prometheus page on the port clusterctl set: both members healthy as the router sees them
        with urllib.request.urlopen(f"http://127.0.0.1:{m_port}/metrics", timeout=5) as r:
            page = r.read().decode()
        assert f'vllm_router_worker_health{{worker="http://127.0.0.1:{p_port}"}} 1' in page
        assert f'vllm_router_worker_health{{worker="http://127.0.0.1:{d_port}"}} 1' in page
    finally:
        router.terminate()
        router.wait(10)
