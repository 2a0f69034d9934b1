"""oom.cause on vLLM logs of several versions and kernel OOM lines; oom.fit and gpu.foreign on facts."""

from __future__ import annotations

from typing import Any

from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.oom import check_fit, check_foreign, check_oom_cause
from clusterctl.diagnose.vllmlog import gib, parse_log

import gpu_facts as G

GIB = 2**30


def causes(log: str, instance: str = "qwen-a", host: str = "gpu01", facts=None, inv: Any = "default"):
    c = G.ctx(
        facts if facts is not None else G.healthy(), inv=inv, raw={host: {f"{instance}.log": G.fixture(f"vllm/{log}")}}
    )
    return [f for f in check_oom_cause(c) if f.subject == f"instance:{instance}"]


def test_sizes_in_binary_and_decimal_units():
    assert gib("512", "MiB") == 0.5 and gib("2", "GiB") == 2.0
    assert abs(gib("1", "GB") - 0.9313) < 1e-3


def test_kv_cache_too_small_v0_11_gives_the_length_that_fits_and_the_utilisation_needed():
    (f,) = causes("startup_fail_kv_cache_exhaustion_v0.11.0.log")
    assert f.severity == Severity.CRIT
    assert "max_model_len 40960 (5.62 GiB KV needed, 2.87 GiB available)" in f.message
    # the log ran with 0.25 (not the inventory's 0.9): 0.25 + (5.62 - 2.87) / 80 GiB -> 0.29
    assert "--max-model-len to at most 20880" in f.action
    assert "from 0.25 to at least 0.29" in f.action


def test_kv_cache_too_small_v0_6():
    (f,) = causes("startup_fail_kv_v0.6.6.log")
    assert "max_model_len 131072" in f.message and "96251" in f.action


def test_no_kv_memory_v0_8_names_the_weights():
    (f,) = causes("startup_fail_no_kv_v0.8.5.log")
    assert "weights take 65.71 GiB per GPU" in f.message and "quantize" in f.action


def test_free_memory_at_start_names_the_foreign_process_from_facts():
    facts = G.healthy()
    facts["gpu01"]["gpus"]["devices"][0]["processes"] = [
        {"pid": 3900000, "used_memory": 59 * GIB, "name": "python3", "unit": "user@1000.service"}
    ]
    (f,) = causes("startup_fail_free_memory_v0.33.0.log", facts=facts)
    assert "20.11 GiB free of 79.19, the instance wants 0.92 x = 72.85 GiB" in f.message
    assert "pid 3900000 (python3, unit user@1000.service) holds 59.0 GiB on GPU 0" in f.action
    assert "--gpu-memory-utilization to 0.25" in f.action


def colocated(util_b: float):
    """qwen-b moved onto qwen-a's GPUs (the validator refuses that in a file; a
    hand-edited deployment or a stale unit can still do it)."""
    inv = G.inventory()
    inv.instances["qwen-b"].placement = inv.instances["qwen-a"].placement
    inv.instances["qwen-b"].args["gpu-memory-utilization"] = util_b
    return inv


def test_free_memory_at_start_with_colocated_instances_over_one():
    inv = colocated(0.3)
    (f,) = causes("startup_fail_free_memory_v0.33.0.log", inv=inv)
    assert "qwen-a, qwen-b on the same GPUs ask for 1.20" in f.action


def test_weights_that_do_not_fit_suggest_the_tp_that_would():
    inv = G.inventory(G.INVENTORY.replace("placement: gpu02:[0-3]", "placement: gpu02:[0]"))
    (f,) = causes("startup_oom_weights_v0.11.0.log", instance="llama", host="gpu02", inv=inv)
    assert f.message.startswith("the model weights do not fit")
    assert "weights need 131.4 GiB per GPU at TP 1" in f.message and "TP 4 would fit" in f.message
    assert "--tensor-parallel-size" in f.action


def test_cuda_graph_capture_oom_suggests_enforce_eager():
    (f,) = causes("startup_oom_cudagraph_v0.11.0.log")
    assert "capturing CUDA graphs" in f.message and "--enforce-eager" in f.action


def test_cuda_oom_with_another_process_names_it():
    (f,) = causes("oom_foreign_process_v0.11.0.log")
    assert "other processes hold the GPU (pid 3900000 30.0 GiB)" in f.message


def test_successful_start_has_no_cause():
    assert causes("startup_success_v0.11.0.log") == []
    ev = parse_log(G.fixture("vllm/startup_success_v0.11.0.log"))
    assert ev.ready and ev.kv_avail_gib == 38.04 and ev.max_model_len == 32768


def test_kernel_oom_killer_is_tied_to_the_instance_by_its_unit():
    facts = G.healthy()
    facts["gpu02"]["kernel_log"]["lines"] = [{"text": t} for t in G.fixture("gpu/kernel_oom_vllm.log").splitlines()]
    found = [f for f in check_oom_cause(G.ctx(facts)) if f.host == "gpu02"]
    mine = [f for f in found if f.subject == "instance:qwen-a"]
    assert len(mine) == 1 and mine[0].severity == Severity.CRIT
    assert "pid 51234 (VLLM::Worker_TP) holding 180.0 GiB RAM" in mine[0].message
    other = [f for f in found if f.subject == "host"]
    assert [(f.severity, "backup-agent" in f.message) for f in other] == [(Severity.WARN, True)]


def test_unit_killed_by_oom_killer():
    facts = G.healthy()
    facts["gpu01"]["units"] = [{"unit": "clusterctl-qwen-b.service", "result": "oom-kill", "active_state": "failed"}]
    (f,) = [f for f in check_oom_cause(G.ctx(facts)) if f.host == "gpu01"]
    assert (f.subject, f.severity) == ("instance:qwen-b", Severity.CRIT)


def test_fit_predicts_colocated_overcommit_weights_and_max_model_len():
    inv = colocated(0.9)
    llama = G.inventory(G.INVENTORY.replace("placement: gpu02:[0-3]", "placement: gpu02:[0]")).instances["llama"]
    inv.instances["llama"] = llama  # 70B on one GPU
    found = {(f.subject, f.severity): f for f in check_fit(G.ctx(G.healthy(), inv=inv))}
    assert "share GPUs and ask for 1.80" in found[("instance:qwen-a", Severity.CRIT)].message
    w = found[("instance:llama", Severity.CRIT)]
    assert "weights need 131.4 GiB per GPU" in w.message and "use TP 4" in w.action


def test_fit_max_model_len_too_long_for_the_kv_cache():
    text = G.INVENTORY.replace(
        "args: {max-model-len: 8192, gpu-memory-utilization: 0.9}",
        "args: {max-model-len: 131072, gpu-memory-utilization: 0.5}",
    )
    found = [f for f in check_fit(G.ctx(G.healthy(), inv=G.inventory(text))) if f.subject == "instance:llama"]
    (f,) = found
    # 80 layers x 2 kv heads/GPU x 128 x 2 x 2 B = 80 KiB/token -> 10 GiB for 131072; 40 - 32.9 GiB left
    assert f.severity == Severity.CRIT and "max_model_len 131072 needs 10.00 GiB" in f.message
    assert "--max-model-len to at most" in f.action


def test_foreign_process_on_an_instance_gpu_and_the_next_start():
    facts = G.healthy()
    facts["gpu01"]["gpus"]["devices"][1]["processes"] = [
        {"pid": 4242, "used_memory": 30 * GIB, "name": "python3", "unit": "session-3.scope"},
        {"pid": 5000, "used_memory": 40 * GIB, "name": "python3", "unit": "clusterctl-qwen-a.service"},
    ]
    found = [f for f in check_foreign(G.ctx(facts)) if f.severity != Severity.OK]
    assert [(f.host, f.subject, f.severity) for f in found] == [("gpu01", "gpu:1", Severity.CRIT)]
    assert "pid 4242 (python3, unit session-3.scope) holds 30.0 GiB on GPU 1" in found[0].action
    fit = [f for f in check_fit(G.ctx(facts)) if f.subject == "instance:qwen-a"]
    assert fit[0].severity == Severity.CRIT and "the next start needs 0.90 x 80 GiB free" in fit[0].message


def test_process_on_an_unassigned_gpu_is_not_foreign():
    facts = G.healthy()
    facts["gpu01"]["gpus"]["devices"][7]["processes"] = [{"pid": 1, "used_memory": GIB, "name": "x", "unit": None}]
    assert all(f.severity == Severity.OK for f in check_foreign(G.ctx(facts)))


def test_kv_cache_too_small_real_032_cpu_with_an_explicit_kv_size_names_that_knob():
    """Real vLLM 0.32 (CPU) with --kv-cache-memory-bytes 1048576 --max-model-len 4096: its own message says
    "Try increasing `gpu_memory_utilization`", which does not size an explicit KV cache."""
    from pathlib import Path

    log = (
        Path(__file__).resolve().parents[2] / "fixtures" / "vllm" / "startup_fail_kv_too_small_v0.32.0_cpu.log"
    ).read_text()
    c = G.ctx(G.healthy(), inv="default", raw={"gpu01": {"qwen-a.log": log}})
    (f,) = [f for f in check_oom_cause(c) if f.subject == "instance:qwen-a"]
    assert f.severity == Severity.CRIT and f.message.startswith("KV cache too small for max_model_len 4096")
    assert "--max-model-len to at most 896" in f.action
    # 1 MiB held 896 tokens: 4096 tokens need 1 MiB x 4096 / 896, rounded up to whole MiB
    assert "raise --kv-cache-memory-bytes from 1048576 to at least 5242880 bytes" in f.action
    assert "gpu-memory-utilization from" not in f.action


def test_fit_leaves_cpu_engines_alone():
    """Two CPU-engine instances on one host's CPU slot share no GPU memory: no oom.fit finding for them."""
    from clusterctl.inventory.model import CPU_SLOT, Engine, GpuRef

    inv = colocated(0.9)
    inv.engines["vllm-cpu"] = Engine("vllm-cpu", "/opt/vllm-cpu/bin/vllm", "0.32.0", device="cpu")
    for name in ("qwen-a", "qwen-b"):
        inv.instances[name].engine = "vllm-cpu"
        inv.instances[name].placement = (GpuRef("gpu01", CPU_SLOT),)
    found = [f for f in check_fit(G.ctx(G.healthy(), inv=inv)) if f.subject in ("instance:qwen-a", "instance:qwen-b")]
    assert found == []
