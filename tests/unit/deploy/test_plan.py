"""The per-host diff: new, changed (with a diff, secrets redacted), start, unchanged, remove."""

from __future__ import annotations

import json

from clusterctl.deploy import spec
from clusterctl.node.deploy import env_hashes
from clusterctl.deploy.rollout.plan import make_plan, matches, render_text
from clusterctl.deploy.remote import HostState, InstanceState

SALT = "s4lt"
KEY = "sk-very-secret-123"


def rendered(
    name: str, host: str = "h1", flags: str = "--max-model-len 4096", key: str = KEY, level: str = "INFO"
) -> spec.RenderedInstance:
    unit = f"[Unit]\nDescription={name}\n[Service]\nExecStart=/opt/vllm serve /models/m {flags}\n"
    env = f"VLLM_API_KEY={key}\nVLLM_LOGGING_LEVEL={level}\n"
    return spec.RenderedInstance(
        name, host, unit, env, 8000, (0,), "m", "/models/m", "v1", "vllm-0.11", "0.11.0", frozenset({"VLLM_API_KEY"})
    )


def have(r: spec.RenderedInstance, active: str = "active") -> InstanceState:
    return InstanceState(
        r.instance, r.unit_text, r.digest, env_hashes(r.env_text, SALT), True, active, "running", 0, 1, "enabled", 1, {}
    )


def host(*insts: InstanceState, name: str = "h1") -> HostState:
    return HostState(name, {i.instance: i for i in insts}, salt=SALT)


def actions(plan) -> dict[str, str]:
    return {i.instance: i.action for h in plan.hosts for i in h.items}


def test_every_kind_of_difference_on_one_host() -> None:
    a, b, c = rendered("a"), rendered("b"), rendered("c")
    b_old = rendered("b", flags="--max-model-len 2048")
    gone = rendered("gone")
    states = {"h1": host(have(a), have(b_old), have(c, active="failed"), have(gone))}
    plan = make_plan([a, b, c, rendered("new")], states, ["h1"])
    assert actions(plan) == {"a": "unchanged", "b": "changed", "c": "start", "new": "new", "gone": "remove"}
    assert plan.pending and plan.counts() == {"new": 1, "changed": 1, "start": 1, "unchanged": 1, "remove": 1}
    item = next(i for i in plan.hosts[0].items if i.instance == "b")
    assert "-ExecStart=/opt/vllm serve /models/m --max-model-len 2048" in item.unit_diff
    assert "+ExecStart=/opt/vllm serve /models/m --max-model-len 4096" in item.unit_diff
    assert item.env_changes == []


def test_nothing_pending_when_everything_matches() -> None:
    a = rendered("a")
    plan = make_plan([a], {"h1": host(have(a))}, ["h1"])
    assert not plan.pending and plan.changed_hosts() == []


def test_env_changes_show_plain_values_and_hide_secrets() -> None:
    old = rendered("a", key="old-key", level="INFO")
    new = rendered("a", key=KEY, level="DEBUG")
    plan = make_plan([new], {"h1": host(have(old))}, ["h1"])
    item = plan.hosts[0].items[0]
    assert item.action == "changed" and item.unit_diff == ""
    assert [str(c) for c in item.env_changes] == ["~VLLM_API_KEY=***", "~VLLM_LOGGING_LEVEL=DEBUG"]
    text = render_text(plan) + json.dumps(plan.to_dict())
    assert KEY not in text and "old-key" not in text and "VLLM_API_KEY=***" in text


def test_a_new_instance_shows_its_unit_and_redacted_env() -> None:
    plan = make_plan([rendered("a")], {"h1": host()}, ["h1"])
    text = render_text(plan)
    assert "+ExecStart=/opt/vllm serve" in text and "+VLLM_API_KEY=***" in text and KEY not in text


def test_instance_pattern_limits_both_desired_and_removed() -> None:
    a, b = rendered("qwen-1"), rendered("llama-1", flags="--x")
    stray = have(rendered("qwen-9"))
    other = have(rendered("other"))
    states = {"h1": host(have(rendered("llama-1")), stray, other)}
    plan = make_plan([a, b], states, ["h1"], instances="qwen-*")
    assert actions(plan) == {"qwen-1": "new", "qwen-9": "remove"}
    assert matches("a", None) and matches("llama-1", "x,llama-*") and not matches("a", "b")


def test_unreadable_host_is_an_error_row_and_pending() -> None:
    plan = make_plan([rendered("a")], {"h1": HostState("h1", error="unreachable")}, ["h1", "h2"])
    assert [(h.host, h.error, h.items) for h in plan.hosts] == [("h1", "unreachable", []), ("h2", "not read", [])]
    assert plan.pending


def test_desired_instances_of_unselected_hosts_are_ignored() -> None:
    plan = make_plan([rendered("a", host="h2")], {"h1": host()}, ["h1"])
    assert actions(plan) == {}
