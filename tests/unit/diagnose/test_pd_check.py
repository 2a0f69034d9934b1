"""pd.kv_transfer: failed or slow KV pulls of a prefill/decode pool name the pair and the path.

The /metrics texts are written by the simulator's Metrics (the NIXL connector's
metric names and histogram layout of vLLM 0.32, kvtransfer.py)."""

from __future__ import annotations

from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.registry import AnalysisContext, run_analyzers
from clusterctl.diagnose.thresholds import load_thresholds
from clusterctl.inventory.loader import load_inventory_text
from clusterctl.lab.vllm_sim.metrics import Metrics

INV = """\
version: 1
defaults:
  ssh: {user: root}
  gpus: {count: 2, model: H100-SXM5-80GB, memory_gib: 80, interconnect: nvlink}
  nics:
    - {netdev: eth0, role: management}
    - {netdev: eth2, role: data, rdma_device: mlx5_0, port: 1, speed_gbps: 400}
hosts:
  gpu01: {address: 10.0.0.11}
  gpu02: {address: 10.0.0.12}
engines:
  vllm-0.11: {path: /opt/vllm-0.11/bin/vllm, version: "0.11.0"}
models:
  qwen3-8b: {path: /models/qwen3-8b}
instances:
  qp1: {model: qwen3-8b, engine: vllm-0.11, placement: "gpu01:0", port: 8001, role: prefill}
  qd1: {model: qwen3-8b, engine: vllm-0.11, placement: "gpu02:0", port: 8001, role: decode}
pd_pools:
  qwen-pd: {model: qwen3-8b, router: {host: gpu01, port: 8300}}
"""
MB = 2**20


def _metrics(transfers: list[tuple[float, float]], failed: int = 0) -> str:
    m = Metrics("0.11", "qwen3-8b", {})
    m.enable_nixl()
    for secs, nbytes in transfers:
        m.observe("vllm:nixl_xfer_time_seconds", secs)
        m.observe("vllm:nixl_bytes_transferred", nbytes)
    m.add("vllm:nixl_num_failed_transfers", failed)
    return m.render()


def _run(raw: dict[str, str]) -> list:
    inv = load_inventory_text(INV, "site.yaml")
    ctx = AnalysisContext(inventory=inv, facts={}, raw={"gpu02": raw}, interval_s=10.0, thresholds=load_thresholds())
    return run_analyzers(ctx, ["pd.kv_transfer"])


def test_healthy_transfers_are_ok() -> None:
    # 100 MiB at 400 Gbit/s: 2.1 ms
    [f] = _run({"qd1.metrics": _metrics([(0.0022, 100 * MB)] * 5)})
    assert f.severity is Severity.OK and "decode qd1 <- prefill qp1" in f.message


def test_slow_transfers_over_the_interval_name_the_pair_and_the_path() -> None:
    before = _metrics([(0.0022, 100 * MB)] * 5)
    after = _metrics([(0.0022, 100 * MB)] * 5 + [(0.025, 100 * MB)] * 4)  # a pause storm: 10x
    [f] = _run({"qd1.metrics": before, "qd1.metrics.2": after})
    assert f.severity is Severity.WARN
    assert "decode qd1 <- prefill qp1 (pool qwen-pd): KV transfers slow in 10 s: 25.0 ms each" in f.message
    assert "gpu01 eth2/mlx5_0 -> gpu02 eth2/mlx5_0" in f.message
    assert "roce" in f.action
    # the same slow transfers before the interval, healthy ones during it: OK
    [ok] = _run(
        {
            "qd1.metrics": after,
            "qd1.metrics.2": _metrics([(0.0022, 100 * MB)] * 5 + [(0.025, 100 * MB)] * 4 + [(0.0022, 100 * MB)] * 3),
        }
    )
    assert ok.severity is Severity.OK


def test_failed_transfers_are_crit() -> None:
    [f] = _run(
        {
            "qd1.metrics": _metrics([(0.0022, 100 * MB)], failed=0),
            "qd1.metrics.2": _metrics([(0.0022, 100 * MB)], failed=3),
        }
    )
    assert f.severity is Severity.CRIT
    assert "3 KV transfer(s) failed in 10 s over gpu01 eth2/mlx5_0 -> gpu02 eth2/mlx5_0" in f.message


def test_a_decode_member_without_connector_metrics_is_unknown() -> None:
    m = Metrics("0.11", "qwen3-8b", {}).render()
    [f] = _run({"qd1.metrics": m})
    assert f.severity is Severity.UNKNOWN and "no KV-transfer metrics" in f.message
