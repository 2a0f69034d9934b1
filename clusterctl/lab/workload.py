"""A demo workload for the lab: a small real-byte model, a template of replicas and a gateway.

``clusterctl lab workload`` writes the lab's inventory plus ``models``, ``templates`` and
``gateway`` sections, so ``deploy``, ``status``, ``gateway`` and ``bench`` run on the lab
unchanged.  The model (``tiny-qwen3``, about 6.6 MB of deterministic bytes) is written on
this machine and staged to the hosts by ``deploy`` (pushed over SSH).  The simulator's time
scale (``VLLM_SIM_TIME_SCALE``) is set in the template's environment: 0 starts instantly,
1 takes the latency model at face value.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from clusterctl.lab.vllm_sim import synth
from clusterctl.inventory.nodeset import expand

MODEL = "tiny"
ARCH = "tiny-qwen3"


def model_entry(
    model_dir: Path, version: str = "v1", *, path: str = f"/models/{MODEL}", served_name: str = MODEL
) -> dict[str, Any]:
    """A ``models:`` entry of the tiny model: its path on the nodes, its source here
    (``model_dir``), and its architecture (what pre-flight falls back on before staging)."""
    a = synth.arch(ARCH)
    return {
        "path": path,
        "source": str(model_dir),
        "version": version,
        "served_name": served_name,
        "arch": {
            "layers": a.layers,
            "hidden_size": a.hidden,
            "attention_heads": a.heads,
            "kv_heads": a.kv_heads,
            "head_dim": a.head_dim,
            "vocab": a.vocab,
            "params": synth.param_count(a),
            "dtype": "bfloat16",
        },
    }


def add_workload(
    inventory: dict[str, Any],
    model_dir: Path,
    *,
    replicas: int,
    gateway_host: str,
    time_scale: float,
    engine: str = "vllm-0.11",
    port_base: int = 8000,
    gateway_port: int = 8080,
) -> dict[str, Any]:
    """``inventory`` (the lab's, as data) with the demo workload added; pure."""
    doc = dict(inventory)
    doc["models"] = {MODEL: model_entry(model_dir)}
    doc["templates"] = {
        "pool": {
            "model": MODEL,
            "engine": engine,
            "replicas": replicas,
            "tp": 1,
            "hosts": "all",
            "port_base": port_base,
            "args": {"max-model-len": 4096, "max-num-seqs": 64},
            "env": {"VLLM_SIM_TIME_SCALE": f"{time_scale:g}"},
        }
    }
    # A lab on a private bridge: an open gateway (a real one wants `auth: keys`, docs/gateway.md).
    doc["gateway"] = {"hosts": gateway_host, "port": gateway_port, "max_conns": 16, "auth": "none"}
    return doc


def write(
    lab_inventory: Path, out: Path, model_dir: Path, *, replicas: int, gateway_host: str | None, time_scale: float
) -> dict[str, Any]:
    """Make the model under ``model_dir`` (if missing) and write the inventory to ``out``.

    ``gateway_host`` defaults to the lab's first host.  Returns the summary printed by the CLI.
    """
    base = yaml.safe_load(lab_inventory.read_text())
    if not (model_dir / "config.json").is_file():
        synth.write_model(ARCH, model_dir)
    gw = gateway_host or _first_host(base)
    doc = add_workload(base, model_dir, replicas=replicas, gateway_host=gw, time_scale=time_scale)
    text = "# Written by `clusterctl lab workload`: the lab inventory plus a demo workload.\n" + yaml.safe_dump(
        doc, sort_keys=False, default_flow_style=None, width=100
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(out)
    return {"inventory": str(out), "model_dir": str(model_dir), "replicas": replicas, "gateway": gw}


def _first_host(doc: dict[str, Any]) -> str:
    first_key = next(iter(doc.get("hosts") or {}))
    return str(expand(first_key)[0])
