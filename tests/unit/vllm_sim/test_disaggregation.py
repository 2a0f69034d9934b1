"""Prefill/decode roles in the simulator: --kv-transfer-config, the KV pull and its cost.

The request protocol is the one vllm-router's ``--vllm-pd-disaggregation`` speaks
(seen on the wire, docs/disaggregation.md): the prefill instance gets
``max_tokens: 1`` and ``kv_transfer_params.do_remote_decode``, the decode instance
the original request with the params the prefill answered.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterctl.lab.hardware import faults, provision_host
from clusterctl.lab.hardware.host import hw_dir
from clusterctl.lab.vllm_sim import memory
from clusterctl.lab.vllm_sim.kvtransfer import LOSSY_SHARE, link_state, parse_kv_config

from .conftest import READY
from .promparse import parse

NIXL_BOTH = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})
PROMPT = " ".join(f"w{i}" for i in range(2000))


def _host(tmp: Path, name: str) -> Path:
    provision_host(tmp / name, name, 0, 2, "H100-SXM5-80GB", "mlnx")
    return tmp / name


def _metric(sim, name: str) -> float:
    code, body = sim.get("/metrics")
    assert code == 200
    fams = parse(body.decode())
    return sum(fams.get(name, {}).values())


def _pd(start_sim, models, tmp_path):
    p_host, d_host = _host(tmp_path, "lab01"), _host(tmp_path, "lab02")
    env = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.1"}
    pre = start_sim(hw_dir(p_host) / "nvml.json", models["qwen3-8b"], "--kv-transfer-config", NIXL_BOTH, env=env)
    dec = start_sim(hw_dir(d_host) / "nvml.json", models["qwen3-8b"], "--kv-transfer-config", NIXL_BOTH)
    assert pre.wait_for(READY) and dec.wait_for(READY), pre.log + dec.log
    return pre, dec, p_host, d_host


def _through(pre, dec, max_tokens: int = 4) -> tuple[int, dict]:
    """What the router does for one request."""
    code, body = pre.post(
        "/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
    )
    assert code == 200, body
    params = json.loads(body)["kv_transfer_params"]
    code, body = dec.post(
        "/v1/completions",
        {"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "kv_transfer_params": params},
    )
    return code, json.loads(body)


def test_kv_transfer_config_is_checked_like_vllm() -> None:
    cfg = parse_kv_config('{"kv_connector":"NixlConnector","kv_role":"kv_producer"}')
    assert cfg.produces and not cfg.consumes
    with pytest.raises(ValueError, match="Unsupported connector type: Nope"):
        parse_kv_config('{"kv_connector":"Nope","kv_role":"kv_both"}')
    with pytest.raises(ValueError, match="kv_role"):
        parse_kv_config('{"kv_connector":"NixlConnector"}')
    with pytest.raises(ValueError, match="JSON"):
        parse_kv_config("{kv_connector: x}")


def test_bad_kv_transfer_config_stops_serve_with_a_usage_error(start_sim, host, models) -> None:
    sim = start_sim(host, models["tiny"], "--kv-transfer-config", '{"kv_connector":"Nope","kv_role":"kv_both"}')
    assert sim.wait(30) == 2
    assert "argument --kv-transfer-config: Unsupported connector type: Nope" in sim.log


def test_link_state_follows_the_nic_faults(tmp_path: Path) -> None:
    h = _host(tmp_path, "lab01")
    state = lambda: json.loads((hw_dir(h) / "nic.json").read_text())  # noqa: E731
    healthy = link_state(state())
    assert healthy.bytes_per_s == pytest.approx(400e9 / 8) and healthy.why == ""
    faults.pause_storm(h, nic="eth2", priority=3, per_s=20000, paused=0.9)
    paused = link_state(state())
    assert paused.bytes_per_s == pytest.approx(400e9 / 8 * 0.1)
    assert "eth2 paused 90% on priority 3" in paused.why
    faults.pause_storm(h, nic="eth2", priority=3, per_s=0)
    faults.qos_pfc(h, nic="eth2", priority=4)
    lossy = link_state(state())
    assert lossy.bytes_per_s == pytest.approx(400e9 / 8 * LOSSY_SHARE)
    assert "PFC off on RoCE priority 3" in lossy.why
    faults.link_down(h, nic="eth2")
    assert link_state(state()).bytes_per_s == 0


def test_prefill_hands_its_kv_to_decode_and_the_pull_costs_bytes_over_link(start_sim, models, tmp_path) -> None:
    pre, dec, p_host, d_host = _pd(start_sim, models, tmp_path)
    code, body = pre.post(
        "/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
    )
    assert code == 200
    params = json.loads(body)["kv_transfer_params"]
    n_prompt = json.loads(pre.post("/tokenize", {"prompt": PROMPT})[1])["count"]
    assert params["do_remote_prefill"] is True and params["remote_host"] == "10.0.0.1"
    assert params["remote_port"] == 5600 and params["remote_engine_id"]
    assert len(params["remote_block_ids"]) == -(-n_prompt // 16)
    # A plain request carries no params back.
    code, body = pre.post("/v1/completions", {"prompt": "hi", "max_tokens": 1})
    assert json.loads(body)["kv_transfer_params"] is None

    code, out = _through(pre, dec)
    assert code == 200 and out["usage"]["completion_tokens"] == 4
    shape = memory.ModelShape.from_config(json.loads((models["qwen3-8b"] / "config.json").read_text()))
    kv_bytes = n_prompt * memory.kv_bytes_per_token(shape, 1, 2)
    healthy = _metric(dec, "vllm:nixl_xfer_time_seconds_sum")
    assert healthy == pytest.approx(kv_bytes / (400e9 / 8), rel=0.01)
    assert _metric(dec, "vllm:nixl_bytes_transferred_sum") == pytest.approx(kv_bytes)
    # The decode did not prefill the prompt again: its steps computed one token of it, then decoded.
    assert _metric(dec, "vllm:iteration_tokens_total_sum") == 4

    # A pause storm on the prefill host's RoCE priority: the pull runs at a tenth of the rate.
    faults.pause_storm(p_host, nic="eth2", priority=3, per_s=20000, paused=0.9)
    code, out = _through(pre, dec)
    assert code == 200
    assert _metric(dec, "vllm:nixl_xfer_time_seconds_sum") - healthy == pytest.approx(10 * healthy, rel=0.01)

    # The decode host's data link goes down: the transfer fails (vLLM's default policy: the request fails).
    faults.link_down(d_host, nic="eth2")
    faults.link_down(d_host, nic="eth3")
    code, out = _through(pre, dec)
    assert code == 500 and "KV cache load failed" in out["error"]["message"]
    assert _metric(dec, "vllm:nixl_num_failed_transfers_total") == 1


def test_prefill_only_instances_ignore_remote_prefill_params(start_sim, models, tmp_path) -> None:
    h = _host(tmp_path, "lab01")
    producer = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_producer"})
    pre = start_sim(hw_dir(h) / "nvml.json", models["qwen3-8b"], "--kv-transfer-config", producer)
    assert pre.wait_for(READY), pre.log
    code, _ = pre.post(
        "/v1/completions",
        {
            "prompt": PROMPT,
            "max_tokens": 2,
            "kv_transfer_params": {"do_remote_prefill": True, "remote_engine_id": "x", "remote_block_ids": [0]},
        },
    )
    assert code == 200
    assert _metric(pre, "vllm:nixl_bytes_transferred_count") == 0
