"""Pre-flight's other checks: port owners from recorded `ss -Htlnp`, GPU sharing, TP rules,
and the KV prediction error read from vLLM's logs."""

from __future__ import annotations

from typing import Any

import pytest

from clusterctl.deploy.preflight.kvcheck import kv_prediction_error, logged_max_len_estimate
from clusterctl.deploy.preflight.memory import GiB
from clusterctl.deploy.preflight.ports import check_port, parse_ss
from clusterctl.deploy.preflight.checks import GpuProc, check_instances
from clusterctl.deploy.preflight.hosts import host_view
from clusterctl.probe.facts import parse_facts
from clusterctl.diagnose.findings import Severity
from unit.deploy.preflight_helpers import FIXTURES, host, instance, inventory, make_sparse

SAMPLES = FIXTURES.parent / "vllm"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    return {"/models/qwen3-8b": make_sparse("Qwen3-8B", tmp_path_factory.mktemp("m") / "qwen3-8b")}


def _checks(report: Any, name: str) -> list[tuple[str, str]]:
    return [(p.check, p.severity.name) for p in report.row(name).problems]


# -- ports ----------------------------------------------------------------------------------------


def test_parse_ss_reads_addresses_ports_and_owners() -> None:
    ls = parse_ss((FIXTURES / "ss_no_process_column.txt").read_text())
    assert [(li.address, li.port, li.pids) for li in ls] == [
        ("0.0.0.0", 2024, ()),
        ("127.0.0.1", 8002, (990,)),
        ("10.0.0.5", 8003, (77, 78)),
        ("fe80::1", 8004, (5,)),
    ]
    assert ls[2].names == ("nginx", "nginx") and ls[0].wildcard and not ls[1].wildcard


def test_foreign_process_on_the_port_is_a_conflict() -> None:
    ls = parse_ss((FIXTURES / "ss_foreign_http_server.txt").read_text())
    pc = check_port(ls, 8000, "clusterctl-q.service", {1733: "run-r3f2.service", 412: "ssh.service"})
    assert not pc.free and pc.owners == ["python3 (pid 1733, run-r3f2.service)"]
    assert check_port(ls, 8001, "clusterctl-q.service", {}).free
    # IPv6 wildcard [::]:22 and 0.0.0.0:22 both count for port 22.
    ssh = check_port(ls, 22, "clusterctl-q.service", {412: "ssh.service"})
    assert len(ssh.conflicts) == 2 and ssh.owners == ["sshd (pid 412, ssh.service)"]


def test_the_instance_own_unit_is_not_a_conflict() -> None:
    ls = parse_ss((FIXTURES / "ss_own_vllm.txt").read_text())
    mine = check_port(ls, 8001, "clusterctl-q32.service", {2881: "clusterctl-q32.service"})
    assert mine.free and len(mine.own) == 1
    other = check_port(ls, 8001, "clusterctl-q8.service", {2881: "clusterctl-q32.service"})
    assert not other.free and "clusterctl-q32.service" in other.owners[0]


def test_unknown_owner_and_bind_addresses() -> None:
    ls = parse_ss((FIXTURES / "ss_no_process_column.txt").read_text())
    unknown = check_port(ls, 2024, "clusterctl-q.service", {})
    assert not unknown.free and "unidentified" in unknown.owners[0]
    # 127.0.0.1:8002 clashes with a bind on all addresses and on 127.0.0.1, not on another address.
    assert not check_port(ls, 8002, "u", {}, None).free
    assert not check_port(ls, 8002, "u", {}, "127.0.0.1").free
    assert check_port(ls, 8002, "u", {}, "10.0.0.9").free


def test_preflight_refuses_a_taken_port_and_accepts_a_redeploy(models: dict[str, dict[str, Any]]) -> None:
    ss = (FIXTURES / "ss_foreign_http_server.txt").read_text()
    hv = host(models, ss, pid_units={1733: "run-u1.service", 412: "ssh.service"})
    rep = check_instances(
        inventory(), {"q": instance("q", port=8000), "r": instance("r", gpus=(1,), port=8001)}, {"gpu01": hv}
    )
    assert _checks(rep, "q") == [("port.taken", "CRIT")] and "python3 (pid 1733" in rep.row("q").problems[0].message
    assert rep.row("r").ok and not rep.row("r").problems
    own = host(models, (FIXTURES / "ss_own_vllm.txt").read_text(), pid_units={2881: "clusterctl-q.service"})
    assert check_instances(inventory(), {"q": instance("q", port=8001)}, {"gpu01": own}).ok


def test_unreadable_listeners_warn(models: dict[str, dict[str, Any]]) -> None:
    hv = host(models)
    hv.listeners, hv.listeners_error = None, "ss: not found"
    rep = check_instances(inventory(), {"q": instance("q")}, {"gpu01": hv})
    assert _checks(rep, "q") == [("port.unknown", "WARN")] and rep.ok


# -- GPU sharing and free memory -------------------------------------------------------------------


def test_utilisation_sum_above_one_on_a_shared_gpu(models: dict[str, dict[str, Any]]) -> None:
    rep = check_instances(
        inventory(),
        {
            "a": instance("a", port=8000, gpu_memory_utilization=0.6, max_model_len=8192),
            "b": instance("b", port=8001, gpu_memory_utilization=0.5, max_model_len=8192),
        },
        {"gpu01": host(models)},
    )
    assert ("gpu.util_sum", "CRIT") in _checks(rep, "a") and ("gpu.util_sum", "CRIT") in _checks(rep, "b")
    assert "1.1 > 1.0" in rep.row("a").problems[-1].message


def test_two_halves_fit_but_not_with_cuda_graphs_on_top(models: dict[str, dict[str, Any]]) -> None:
    # 0.45 + 0.45 fits 79.15 GiB with contexts and 0.11's graphs; 0.49 + 0.49 does not (0.11 puts the
    # graphs outside the budget), though the utilisations sum below 1.0.
    fine = check_instances(
        inventory(),
        {
            "a": instance("a", port=8000, gpu_memory_utilization=0.45, max_model_len=8192),
            "b": instance("b", port=8001, gpu_memory_utilization=0.45, max_model_len=8192),
        },
        {"gpu01": host(models)},
    )
    assert fine.ok
    tight = check_instances(
        inventory(),
        {
            "a": instance("a", port=8000, gpu_memory_utilization=0.49, max_model_len=8192),
            "b": instance("b", port=8001, gpu_memory_utilization=0.49, max_model_len=8192),
        },
        {"gpu01": host(models)},
    )
    assert ("gpu.shared_fit", "CRIT") in _checks(tight, "a")


def test_another_process_on_the_gpu(models: dict[str, dict[str, Any]]) -> None:
    other = GpuProc(pid=4242, used=int(30 * GiB), unit="train.service", name="python")
    rep = check_instances(
        inventory(),
        {"q": instance("q", gpu_memory_utilization=0.9, max_model_len=8192)},
        {"gpu01": host(models, procs={0: [other]})},
    )
    [p] = rep.row("q").problems
    assert (p.check, p.severity) == ("gpu.free", Severity.CRIT)
    assert "pid 4242 python (train.service) 30.0 GiB" in p.message
    assert p.fit["gpu_memory_utilization"] == 0.61  # (79.14 - 30 - 0.5 context) / 79.15
    fits = check_instances(
        inventory(),
        {"q": instance("q", gpu_memory_utilization=0.61, max_model_len=8192)},
        {"gpu01": host(models, procs={0: [other]})},
    )
    assert fits.ok
    small = check_instances(
        inventory(),
        {"q": instance("q", gpu_memory_utilization=0.5, max_model_len=8192)},
        {"gpu01": host(models, procs={0: [other]})},
    )
    assert _checks(small, "q") == [("gpu.shared", "WARN")]
    # The instance's own running process (a redeploy) frees its memory when restarted.
    mine = GpuProc(pid=77, used=int(72 * GiB), unit="clusterctl-q.service", name="vllm")
    again = check_instances(
        inventory(),
        {"q": instance("q", gpu_memory_utilization=0.9, max_model_len=8192)},
        {"gpu01": host(models, procs={0: [mine]})},
    )
    assert again.ok and not again.row("q").problems


# -- TP rules -------------------------------------------------------------------------------------


def test_tp_rules(models: dict[str, dict[str, Any]]) -> None:
    rep = check_instances(
        inventory(pcie=True), {"q": instance("q", gpus=(0, 1, 2, 3), max_model_len=8192)}, {"gpu01": host(models)}
    )
    assert _checks(rep, "q") == [("tp.interconnect", "WARN")]
    nv = check_instances(
        inventory(), {"q": instance("q", gpus=(0, 1, 2, 3), max_model_len=8192)}, {"gpu01": host(models)}
    )
    assert nv.ok and not nv.row("q").problems
    odd = check_instances(
        inventory(), {"q": instance("q", gpus=(0, 1, 2), max_model_len=8192)}, {"gpu01": host(models)}
    )
    assert ("tp.heads", "CRIT") in _checks(odd, "q")
    few = check_instances(
        inventory(), {"q": instance("q", gpus=(0, 1), max_model_len=8192)}, {"gpu01": host(models, gpus=1)}
    )
    assert ("gpu.missing", "CRIT") in _checks(few, "q") and ("tp.gpus", "CRIT") in _checks(few, "q")


def test_unreadable_host_is_a_crit_row_not_an_exception(models: dict[str, dict[str, Any]]) -> None:
    hv = host(models)
    hv.reason = "unreachable: connection refused"
    rep = check_instances(inventory(), {"q": instance("q")}, {"gpu01": hv})
    assert _checks(rep, "q") == [("host.unreadable", "CRIT")]
    assert "connection refused" in rep.row("q").problems[0].message


# -- after start: KV prediction error ---------------------------------------------------------------


def test_kv_error_from_the_011_sample_uses_the_smallest_rank() -> None:
    k = kv_prediction_error(311_040, (SAMPLES / "startup_success_v0.11.0.log").read_text())
    assert k.logged == 311_040 and k.per_rank == (311_040, 311_616) and k.error_pct == 0.0
    k = kv_prediction_error(300_000, (SAMPLES / "startup_success_v0.11.0.log").read_text())
    assert k.error_pct == pytest.approx(-3.549, abs=0.001)


def test_kv_error_033_combined_line_last_start_only() -> None:
    old = (
        "(APIServer pid=1) INFO 11-30 09:10:41 [utils.py:233] non-default args: {}\n"
        "(EngineCore pid=2) INFO 11-30 09:11:44 [kv_cache_utils.py:1155] GPU KV cache size: 99,999 tokens, "
        "Maximum concurrency for 32,768 tokens per request: 3.05x\n"
    )
    new = old.replace("99,999", "612,352").replace("3.05x", "18.69x")
    k = kv_prediction_error(612_000, old + new)
    assert k.logged == 612_352 and k.per_rank == (612_352,)
    assert k.to_json()["error_pct"] == pytest.approx(-0.057, abs=0.001)


def test_no_kv_line_yet_but_vllm_estimate_of_the_failure() -> None:
    text = (SAMPLES / "startup_fail_kv_cache_exhaustion_v0.11.0.log").read_text()
    k = kv_prediction_error(1000, text)
    assert k.logged is None and k.error_pct is None
    assert logged_max_len_estimate(text) == 20880
    assert logged_max_len_estimate((SAMPLES / "startup_success_v0.11.0.log").read_text()) is None


def test_fixed_kv_cache_size_must_fit_the_free_memory(models: dict[str, dict[str, Any]]) -> None:
    # --kv-cache-memory-bytes skips vLLM's utilisation check, so the whole footprint is compared.
    other = GpuProc(pid=4242, used=int(50 * GiB), unit="train.service", name="python")
    big = check_instances(
        inventory(),
        {"q": instance("q", kv_cache_memory_bytes=20 * GiB, max_model_len=8192)},
        {"gpu01": host(models, procs={0: [other]})},
    )
    [p] = big.row("q").problems
    assert p.check == "gpu.free" and "--kv-cache-memory-bytes (20.0 GiB of KV cache)" in p.message
    small = check_instances(
        inventory(),
        {"q": instance("q", kv_cache_memory_bytes=5 * GiB, max_model_len=8192)},
        {"gpu01": host(models, procs={0: [other]})},
    )
    assert [x.check for x in small.row("q").problems] == ["gpu.shared"]
    assert small.row("q").predicted_kv_tokens == 5 * GiB // (147_456 * 16) * 16


def test_preflight_reasons_over_the_state_after_the_plans_removals(models: dict[str, dict[str, Any]]) -> None:
    # TP 1 -> 2 renames the replicas: the new "q2-1" takes the port and GPUs of the removed "q-1",
    # which still runs (pid 2881 on :8001 and 72 GiB on GPU 0) until its host's node job stops it.
    old = GpuProc(pid=2881, used=int(72 * GiB), unit="clusterctl-q-1.service", name="vllm")
    hv = host(
        models, (FIXTURES / "ss_own_vllm.txt").read_text(), procs={0: [old]}, pid_units={2881: "clusterctl-q-1.service"}
    )
    new = {"q2-1": instance("q2-1", gpus=(0, 1), port=8001, gpu_memory_utilization=0.9, max_model_len=8192)}
    before = check_instances(inventory(), new, {"gpu01": hv})
    assert {c for c, _ in _checks(before, "q2-1")} >= {"port.taken", "gpu.free"}
    after = check_instances(inventory(), new, {"gpu01": hv}, stopping={"gpu01": {"clusterctl-q-1.service"}})
    assert after.ok and not after.row("q2-1").problems
    # Only that host's stopping units count: another host's removal frees nothing here.
    other = check_instances(inventory(), new, {"gpu01": hv}, stopping={"gpu02": {"clusterctl-q-1.service"}})
    assert not other.ok


# -- the engine on the host (issue 23) --------------------------------------------------------------


def test_a_host_without_the_engine_is_a_crit_naming_host_engine_and_path(models: dict[str, dict[str, Any]]) -> None:
    hv = host(models)
    hv.engines = {
        "/opt/vllm-0.11/bin/vllm": {"exists": False, "executable": False},
        "/opt/vllm-0.33/bin/vllm": {"exists": True, "executable": False},
    }
    rep = check_instances(
        inventory(),
        {
            "a": instance("a", max_model_len=8192),
            "b": instance("b", gpus=(1,), port=8001, engine="vllm-0.33", max_model_len=8192),
        },
        {"gpu01": hv},
    )
    a, b = rep.row("a"), rep.row("b")
    assert ("engine.missing", "CRIT") in _checks(rep, "a") and not a.ok
    msg = next(p.message for p in a.problems if p.check == "engine.missing")
    assert "engine vllm-0.11 (vLLM 0.11.0) is not installed on gpu01: no /opt/vllm-0.11/bin/vllm" in msg
    assert "`clusterctl engine install vllm-0.11 --hosts 'gpu01' --wheels DIR`" in msg
    assert "/opt/vllm-0.33/bin/vllm is not an executable file" in next(
        p.message for p in b.problems if p.check == "engine.missing"
    )


def test_an_installed_engine_or_an_unread_one_makes_no_claim(models: dict[str, dict[str, Any]]) -> None:
    hv = host(models)
    hv.engines = {"/opt/vllm-0.11/bin/vllm": {"exists": True, "executable": True}}
    assert "engine.missing" not in [
        c
        for c, _ in _checks(check_instances(inventory(), {"a": instance("a", max_model_len=8192)}, {"gpu01": hv}), "a")
    ]
    hv.engines = None  # an older node reader, or not asked: nothing said either way
    assert "engine.missing" not in [
        c
        for c, _ in _checks(check_instances(inventory(), {"a": instance("a", max_model_len=8192)}, {"gpu01": hv}), "a")
    ]


def test_a_tp_group_across_cpu_sockets_warns_from_the_facts_typed_gpu_pairs(models: dict[str, dict[str, Any]]) -> None:
    doc = {
        "schema": 1,
        "collected_at": "x",
        "host": {"memory": {"available": 64 * GiB}},
        "gpus": {
            "available": True,
            "devices": [
                {"index": i, "name": "NVIDIA H100", "memory_total": 80 * GiB, "memory_free": 79 * GiB} for i in range(4)
            ],
            "topology": [
                {"gpus": [0, 1], "level": "SYSTEM"},
                {"gpus": [2, 3], "level": "NODE"},
                {"gpus": [0, 2], "reason": "not supported"},
            ],
        },
        "nics": [],
    }
    view = host_view("gpu01", parse_facts(doc), None)
    assert [(t.gpus, t.level) for t in view.topology] == [((0, 1), "SYSTEM"), ((2, 3), "NODE"), ((0, 2), None)]
    assert view.mem_available == 64 * GiB and sorted(view.gpus) == [0, 1, 2, 3]
    hv = host(models)
    hv.topology = view.topology
    rep = check_instances(
        inventory(),
        {"far": instance("far", gpus=(0, 1), tensor_parallel_size=2), "near": instance("near", gpus=(2, 3), port=8001)},
        {"gpu01": hv},
    )
    assert ("tp.topology", "WARN") in _checks(rep, "far") and "GPU pairs 0-1 at SYSTEM" in str(rep.row("far").problems)
    assert "tp.topology" not in [c for c, _ in _checks(rep, "near")]
