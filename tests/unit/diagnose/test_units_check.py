"""serving.unit: a wanted instance whose unit is failed/inactive/looping is down, with the reason
from its journal; one that keeps restarting (NRestarts) is a warning."""

from __future__ import annotations

from typing import Any

import pytest

from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.instances import check_units
from clusterctl.diagnose.unitlog import down_reason, root_cause

import gpu_facts as G

JOURNAL = G.fixture("vllm/journal_start_limit_kv_v0.11.0.log")


def unit(name: str, active: str, sub: str, restarts: int = 0, result: str = "success") -> dict[str, Any]:
    return {
        "unit": f"clusterctl-{name}.service",
        "load_state": "loaded",
        "active_state": active,
        "sub_state": sub,
        "result": result,
        "restarts": restarts,
        "exec_main_status": 1,
    }


def run(units1, units2=None, raw=None):
    facts = G.healthy()
    facts["gpu01"]["units"] = units1
    facts["gpu02"]["units"] = units2 if units2 is not None else [unit("llama", "active", "running")]
    return {f.subject: f for f in check_units(G.ctx(facts, raw=raw))}


def test_the_root_cause_is_vllms_first_error_not_its_pointer_to_it():
    # vLLM 0.11 ends with "RuntimeError: Engine core initialization failed. See root cause above"
    cause = root_cause(JOURNAL.splitlines())
    assert cause is not None and cause.startswith(
        "ValueError: To serve at least one request with the models's max seq len (40960)"
    )
    why = down_reason(JOURNAL, "exit-code", "1")
    assert why.startswith("systemd gave up restarting it: start request repeated too quickly")
    assert "ValueError: To serve at least one request" in why


@pytest.mark.parametrize(
    "tail,says",
    [
        (
            "systemd[1]: clusterctl-a.service: Main process exited, code=exited, status=1/FAILURE",
            "exited with status 1/FAILURE",
        ),
        ("systemd[1]: clusterctl-a.service: Deactivated successfully.", "exited with status 0 (vLLM does so"),
        ("systemd[1]: clusterctl-a.service: Main process exited, code=killed, status=9/KILL", "killed (signal 9/KILL)"),
        ("systemd[1]: Stopped clusterctl-a.service - vLLM a.", "stopped on request"),
    ],
)
def test_what_systemd_did_last(tail, says):
    assert says in down_reason("x\n" + tail + "\n")


def test_a_start_up_check_refusal_is_the_reason():
    journal = (
        "systemd[1]: Starting clusterctl-a.service - vLLM a...\n"
        "check-gpus[812]: check-gpus: refusing to start: placed GPU(s) GPU-9e0d not present on this host "
        "(present: 0=GPU-3b1f)\n"
        "systemd[1]: clusterctl-a.service: Control process exited, code=exited, status=1/FAILURE\n"
    )
    assert down_reason(journal, "exit-code") == (
        "a start-up check (ExecStartPre) failed with status 1/FAILURE; check-gpus: placed GPU(s) GPU-9e0d not "
        "present on this host (present: 0=GPU-3b1f)"
    )


def test_no_journal_falls_back_to_the_result_and_says_so_when_nothing_is_known():
    assert down_reason("", "oom-kill") == "systemd result: oom-kill"
    assert down_reason("", "success") == "no reason in the journal"


def test_failed_instance_is_down_with_the_journal_reason():
    fs = run(
        [unit("qwen-a", "failed", "failed", 4, "exit-code"), unit("qwen-b", "active", "running")],
        raw={"gpu01": {"qwen-a.log": JOURNAL}},
    )
    f = fs["instance:qwen-a"]
    assert (f.severity, f.host) == (Severity.CRIT, "gpu01")
    assert f.message.startswith("down: unit failed: systemd gave up restarting it")
    assert "ValueError: To serve at least one request" in f.message
    assert "journalctl -u clusterctl-qwen-a.service on gpu01" in f.action
    assert fs["instance:qwen-b"].severity == Severity.OK and fs["instance:llama"].severity == Severity.OK


def test_inactive_absent_and_crash_looping_instances_are_down():
    fs = run(
        [unit("qwen-a", "inactive", "dead"), unit("qwen-b", "activating", "auto-restart", 2, "exit-code")], units2=[]
    )
    assert fs["instance:qwen-a"].severity == Severity.CRIT and "down: unit inactive" in fs["instance:qwen-a"].message
    assert fs["instance:qwen-b"].severity == Severity.CRIT
    assert fs["instance:qwen-b"].message.startswith("crash loop: between automatic restarts (2 so far)")
    assert "instance:llama" not in fs  # no unit: status reports it absent; doctor checks the units it finds


def test_an_instance_that_keeps_restarting_is_a_warning():
    fs = run([unit("qwen-a", "active", "running", 3), unit("qwen-b", "active", "running", 1)])
    assert fs["instance:qwen-a"].severity == Severity.WARN
    assert "systemd restarted it 3 times (NRestarts)" in fs["instance:qwen-a"].message
    assert fs["instance:qwen-b"].severity == Severity.OK and "restarted 1 time(s)" in fs["instance:qwen-b"].message


def test_units_not_read_is_unknown_and_a_host_without_facts_is_left_alone():
    facts = G.healthy()
    facts["gpu01"]["units"] = None
    del facts["gpu02"]
    fs = check_units(G.ctx(facts, missing={"gpu02": "unreachable"}))
    assert {(f.subject, f.severity) for f in fs} == {
        ("instance:qwen-a", Severity.UNKNOWN),
        ("instance:qwen-b", Severity.UNKNOWN),
    }


REPLICA = (
    G.INVENTORY.replace(
        """  llama:
    model: llama-70b
    engine: vllm
    placement: gpu02:[0-3]""",
        """  llama:
    model: llama-70b
    engine: vllm-33
    placement: [gpu01:4, gpu01:5, gpu02:0, gpu02:1]
    port: 8010""",
    )
    .replace("    port: 8010\n    port: 8000\n", "    port: 8010\n")
    .replace(
        "  vllm: {path: /opt/vllm/bin/vllm, version: 0.11.0}",
        "  vllm: {path: /opt/vllm/bin/vllm, version: 0.11.0}\n  vllm-33: {path: /opt/vllm-0.33/bin/vllm, version: 0.33.0}",
    )
)


def run_replica(worker):
    facts = G.healthy()
    facts["gpu01"]["units"] = [
        unit("qwen-a", "active", "running"),
        unit("qwen-b", "active", "running"),
        unit("llama", "active", "running"),
    ]
    facts["gpu02"]["units"] = worker
    return [f for f in check_units(G.ctx(facts, inv=G.inventory(REPLICA))) if f.subject == "instance:llama"]


@pytest.mark.parametrize(
    "active, sub, words",
    [
        ("inactive", "dead", "replica down: worker unit clusterctl-llama-node1.service on gpu02 (rank 1) is inactive"),
        ("failed", "failed", "replica down: worker unit clusterctl-llama-node1.service on gpu02 (rank 1) is failed"),
        ("activating", "auto-restart", "is activating (auto-restart)"),
    ],
)
def test_a_replica_with_one_bad_worker_names_the_worker_unit_and_host(active, sub, words):
    head, worker = run_replica([unit("llama-node1", active, sub, result="exit-code")])
    assert (head.severity, head.host) == (Severity.OK, "gpu01")
    assert (worker.severity, worker.host) == (Severity.CRIT, "gpu02") and words in worker.message
    assert "journalctl -u clusterctl-llama-node1.service on gpu02" in worker.action
    assert "clusterctl restart llama" in worker.action and "clusterctl deploy --instances llama" in worker.action


def test_a_running_worker_adds_nothing_and_a_missing_one_is_crit():
    assert [f.severity for f in run_replica([unit("llama-node1", "active", "running")])] == [Severity.OK]
    _, missing = run_replica([])
    assert (
        missing.severity == Severity.CRIT
        and "no worker unit clusterctl-llama-node1.service on gpu02" in missing.message
    )
