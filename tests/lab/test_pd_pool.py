"""A prefill/decode pool on two lab hosts, deployed by ``clusterctl deploy``, serves through its router and
the gateway; a pause storm slows its KV pulls.

The prefill and decode instances are the simulator (0.11 launcher) deployed as
``clusterctl-pd-p.service`` and ``clusterctl-pd-d.service`` on the first two
lab hosts with the ``--kv-transfer-config`` and environment of their roles
(``deploy/units/pd.py``); the same deploy pushes the pool's router
(``clusterctl-router-pd-q.service``, vllm-router from scripts/install-vllm-router,
bound read-only into the hosts) to the prefill host, last, and gates it with a
completion through it (``deploy/units/pdrouter.py``).  The gateway (nginx on the
decode host) sends the pool's model to the router.  A pause storm on the
prefill host's RoCE priority (both data NICs) makes the decode instance's KV
pulls ten times slower, and doctor's ``pd.kv_transfer`` says so, naming the
pair and the path.  Cheap: sparse model, time scale 0.1, three requests.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from clusterctl.cli.main import main
from clusterctl.deploy.rollout.engine import Deploy, DeployOptions
from clusterctl.deploy.status import routers
from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.registry import AnalysisContext, run_analyzers
from clusterctl.diagnose.thresholds import load_thresholds
from clusterctl.fleet import Fleet
from clusterctl.inventory.loader import load_inventory
from clusterctl.lab.hardware import faults
from support.deploy_lab import remove_deployed
from support.http import http
from unit.vllm_sim.promparse import parse

MODEL = "/models/qwen3-8b"
PORTS = {"prefill": 8401, "decode": 8402}
ROUTER_PORT = 8403
GW_PORT = 8080


#: A sparse Qwen3-8B (headers and sizes: its KV bytes per token price the pulls) laid out on a host as
#: `clusterctl stage` leaves a verified version (node/stage/verify_model.py: the link into .versions/, the
#: manifest of file sizes, the marker naming its sha256), so the deployed units' verify-model passes;
#: staging itself would copy 16 GB of holes.
STAGED_SPARSE = f"""set -e
v={MODEL.rsplit("/", 1)[0]}/.versions/qwen3-8b/sparse
test -L {MODEL} && exit 0
rm -rf {MODEL} "$v"; vllm-sim make-model qwen3-8b "$v" --sparse >/dev/null
python3 - "$v" <<'PY'
import hashlib, json, os, sys
d = sys.argv[1]
files = [{{"path": os.path.relpath(os.path.join(r, f), d), "size": os.path.getsize(os.path.join(r, f)), "sha256": ""}}
         for r, _, fs in os.walk(d) for f in fs]
raw = json.dumps({{"files": files}}).encode()
open(os.path.join(d, ".clusterctl-manifest.json"), "wb").write(raw)
json.dump({{"manifest_sha256": hashlib.sha256(raw).hexdigest()}}, open(os.path.join(d, ".clusterctl-verified"), "w"))
PY
ln -s "$v" {MODEL}
"""


def _xfer(addr: str, port: int) -> tuple[float, float]:
    status, body = http(f"http://{addr}:{port}/metrics", None, 30)
    assert status == 200
    fams = parse(body.decode())
    return (
        sum(fams["vllm:nixl_xfer_time_seconds_sum"].values()),
        sum(fams["vllm:nixl_xfer_time_seconds_count"].values()),
    )


@pytest.fixture
def pool(lab, healed_hosts, tmp_path: Path):
    names = lab.names[:2]
    roles = dict(zip(("prefill", "decode"), names))
    text = Path(lab.inventory).read_text() + "".join(
        [
            f"models:\n  qwen3-8b: {{path: {MODEL}, served_name: qwen3-8b}}\n",
            "instances:\n",
            *(
                f"  pd-{role[0]}: {{model: qwen3-8b, engine: vllm-0.11, placement: \"{h}:0\", port: {PORTS[role]}, "
                f"role: {role}, args: {{max-model-len: 8192}}, env: {{VLLM_SIM_TIME_SCALE: '0.1'}}}}\n"
                for role, h in roles.items()
            ),
            f"pd_pools:\n  pd-q: {{model: qwen3-8b, router: {{host: {roles['prefill']}, port: {ROUTER_PORT}}}}}\n",
            f"gateway:\n  hosts: {roles['decode']}\n  port: {GW_PORT}\n  auth: none\n",
        ]
    )
    inv_path, state = tmp_path / "pd-lab.yaml", tmp_path / "state"
    inv_path.write_text(text)
    inv = load_inventory(str(inv_path))
    try:
        for h in names:
            lab.run(h, STAGED_SPARSE, check=True, timeout=60)
        rep = Deploy(
            inv,
            [inv.hosts[h] for h in names],
            lambda hs: Fleet(list(hs), connect_timeout=10, command_timeout=120),
            str(state),
            DeployOptions(gate_timeout_s=120),
        ).run()
        assert rep.result == "ok", rep.to_dict()
        assert rep.batches[-1][-1] == roles["prefill"]  # the router's host last
        gates = {g.instance: g for o in rep.hosts.values() for g in o.gates}
        assert set(gates) == {"pd-p", "pd-d", "router-pd-q"} and all(g.ok for g in gates.values())
        assert main(["gateway", "deploy", roles["decode"], "-i", str(inv_path), "--state-dir", str(state)]) == 0
        yield inv, {r: inv.hosts[h] for r, h in roles.items()}, f"http://{inv.hosts[roles['decode']].address}:{GW_PORT}"
    finally:
        remove_deployed(
            lab,
            "clusterctl-*pd-*.service",
            "/etc/clusterctl/instances/*pd-*.env /var/lib/clusterctl/deploy/previous/*pd-*",
            names,
        )
        lab.run(roles["decode"], "systemctl disable --now nginx.service", timeout=60)


def _complete(url: str, prompt: str) -> tuple[int, str, dict]:
    req = urllib.request.Request(
        url + "/v1/completions",
        headers={"Content-Type": "application/json"},
        data=json.dumps(
            {
                "model": "qwen3-8b",
                "prompt": prompt,
                "max_tokens": 8,
                # the simulator ends ~1 in 43 tokens with EOS otherwise
                "ignore_eos": True,
            }
        ).encode(),
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.status, r.headers.get("X-Gateway-Instance", ""), json.loads(r.read())


def test_pd_pool_deployed_serves_through_its_router_behind_the_gateway_and_a_pause_storm_slows_its_kv_pulls(
    lab, pool, healed_hosts
):
    inv, hosts, url = pool
    pre, dec = hosts["prefill"], hosts["decode"]
    s0, c0 = _xfer(dec.address, PORTS["decode"])  # the router's gate already pulled once
    prompt = " ".join(f"w{i}" for i in range(1500))
    status, served_by, body = _complete(url, prompt)
    assert status == 200 and served_by == "router-pd-q" and body["usage"]["completion_tokens"] == 8
    # the router's Prometheus page, on the port deploy set (router port + 10000, the host's address): what
    # status shows of it: both members healthy as the router sees them, the requests it carried
    page = routers.read_metrics(inv, ["router-pd-q"])["router-pd-q"]
    rec, bad = routers.view(inv, inv.pd_pools["pd-q"], inv.instances, page)
    assert not bad and [m["healthy"] for m in rec["members"]] == [True, True] and rec["requests_total"], (rec, bad)
    s1, c1 = _xfer(dec.address, PORTS["decode"])
    assert c1 == c0 + 1 and s1 > s0
    one = s1 - s0

    healed_hosts.append(pre.name)
    for nic in ("eth2", "eth3"):
        faults.inject(lab.host_dir(pre.name), "pause-storm", nic=nic, priority=3, per_s=20000, paused=0.9)
    status, _, _ = _complete(url, prompt)
    assert status == 200
    s2, c2 = _xfer(dec.address, PORTS["decode"])
    assert c2 == c1 + 1 and s2 - s1 == pytest.approx(10 * one, rel=0.05)

    # doctor on one sample: the mean over the pulls (the gate's short one, 1x and 10x) is about 5.5x what
    # one 400 Gbit/s port takes
    metrics = http(f"http://{dec.address}:{PORTS['decode']}/metrics", None, 30)[1].decode()
    ctx = AnalysisContext(
        inventory=inv, facts={}, raw={dec.name: {"pd-d.metrics": metrics}}, thresholds=load_thresholds()
    )
    [f] = run_analyzers(ctx, ["pd.kv_transfer"])
    assert f.severity is Severity.WARN, f
    assert "decode pd-d <- prefill pd-p (pool pd-q)" in f.message and pre.name in f.message and dec.name in f.message
