"""The autoscaler's round with the hosts faked: where new replicas go (policy hosts, GPUs, the preferred
GPU model, cordons), what a scale-out records and undoes, the deploy lock, the audit."""

from __future__ import annotations

import textwrap
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from clusterctl.autoscale import record, run
from clusterctl.autoscale.decide import ScalerState
from clusterctl.deploy.rollout import lock
from clusterctl.deploy.state import Cordon, StateStore
from clusterctl.inventory.loader import load_inventory_text

INV = """\
version: 1
defaults:
  gpus: {count: 2, model: L40S, memory_gib: 48, interconnect: pcie}
hosts:
  a01: {address: 10.0.0.11, gpus: {count: 2, model: H100, memory_gib: 80}}
  b01: {address: 10.0.0.12}
  b02: {address: 10.0.0.13}
engines:
  v11: {path: /opt/v/bin/vllm, version: 0.11.0}
models:
  m8: {path: /models/m8}
gateway: {hosts: b02, auth: none}
templates:
  pool:
    model: m8
    engine: v11
    replicas: 1
    tp: 1
    hosts: all
    autoscale:
      min: 1
      max: 5
      scale_out_after_s: 0
      scale_in_after_s: 0
      cooldown_out_s: 0
      cooldown_in_s: 0
      max_step: 3
%s
"""


def inv_with(extra: str = "") -> Any:
    return load_inventory_text(INV % textwrap.indent(textwrap.dedent(extra), " " * 6), "inv.yaml")


@contextmanager
def _fleet(hosts: Any) -> Iterator[Any]:
    yield SimpleNamespace(hosts=[h.name for h in hosts])


def make_fleet(hosts: Any) -> Any:
    return _fleet(hosts)


def test_new_replicas_go_to_the_preferred_gpu_model_then_anywhere_allowed(tmp_path: Path) -> None:
    inv = inv_with("prefer_gpu: H100\nworth: {H100: 1.0, L40S: 0.5}\n")
    pol = inv.templates["pool"].autoscale
    state = StateStore(tmp_path).load()
    sp = run.plan_out(inv, state, "pool", pol, 2)
    assert sp.after == 2 and all(sp.result.instances[n].placement[0].host == "a01" for n in sp.added)
    sp = run.plan_out(inv, state, "pool", pol, 4)  # a01 holds 2: the rest where the policy allows
    hosts = sorted(sp.result.instances[n].placement[0].host for n in sp.result.instances)
    assert sp.after == 4 and hosts.count("a01") == 2


def test_policy_hosts_gpus_and_operator_cordons_limit_scale_out(tmp_path: Path) -> None:
    inv = inv_with('hosts: a01,b01\ngpus: ["a01:0", "b01:[0-1]"]\n')
    pol = inv.templates["pool"].autoscale
    store = StateStore(tmp_path)
    with store.update() as st:
        st.cordons["b01:1"] = Cordon("XID 79", "op@x", "2026-01-01T00:00:00Z")
    sp = run.plan_out(inv, store.load(), "pool", pol, 5)
    # allowed: a01:0, b01:0, b01:1 (cordoned by the operator): 2 replicas fit, not 5
    assert sp.after == 2
    places = {(i.placement[0].host, i.placement[0].index) for i in sp.result.instances.values()}
    assert places == {("a01", 0), ("b01", 0)}
    assert "b01:1" in store.load().cordons and len(store.load().cordons) == 1  # nothing saved, nothing lifted
    with store.update() as st:
        st.cordons["a01"] = Cordon("maintenance", "op@x", "2026-01-01T00:00:00Z")
        st.cordons["b01"] = Cordon("maintenance", "op@x", "2026-01-01T00:00:00Z")
    assert run.plan_out(inv, store.load(), "pool", pol, 3) is None  # no room at all


def row(name: str, state: str = "serving", **kw: Any) -> Any:
    base = dict(
        name=name, state=state, message="", kv_usage=None, waiting=None, running=None, load=None, ttft_p90_s=None
    )
    return SimpleNamespace(**{**base, **kw})


def test_replica_values_and_missing_metrics() -> None:
    ok = row("p-1", kv_usage=0.5, waiting=3.0, running=8.0, load=0.62, ttft_p90_s=None)
    assert [run.replica_value(s, ok) for s in ("load", "queue", "kv")] == [0.62, 3.0, 0.5]
    assert run.replica_value("ttft_p90", ok) is None  # requests wait and none got a first token: not idle
    assert run.replica_value("ttft_p90", row("p-1", kv_usage=0.0, waiting=0.0, running=0.0)) == 0.0
    assert run.replica_value("load", row("p-1", message="metrics: timed out")) is None


def test_measure_marks_unreachable_replicas_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv = inv_with()
    with StateStore(tmp_path).update() as st:
        st.replicas["pool"] = 2
    rows = [
        row("pool-1", kv_usage=0.1, waiting=0.0, running=1.0, load=0.1),
        row("pool-2", state="unknown", message="b01: ssh: timed out"),
    ]
    monkeypatch.setattr("clusterctl.deploy.status.instances.collect_status", lambda *a, **k: rows)
    sig = run.measure(inv, tmp_path, make_fleet, "pool", inv.templates["pool"].autoscale)
    assert sig.current == 2
    got = {r.name: (r.value, r.error) for r in sig.replicas}
    assert got["pool-1"] == (0.1, None) and got["pool-2"] == (None, "b01: ssh: timed out")


class Fake:
    """Lock, engine and gateway stand-ins recording what the autoscaler asked for."""

    def __init__(
        self, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, gates_ok: bool = True, lock_holder: str | None = None
    ) -> None:
        self.calls: list[Any] = []
        self.tmp = tmp_path
        self.gates_ok = gates_ok
        self.lock_holder = lock_holder
        self.marks: dict[str, str] = {}
        monkeypatch.setattr(lock, "acquire", self.acquire)
        monkeypatch.setattr(
            lock, "release", lambda fleet, hosts, run_id, audit=None: self.calls.append(("release", hosts))
        )
        monkeypatch.setattr(run, "_deploy", self.deploy)
        monkeypatch.setattr(run, "_hook", lambda inv, sd, mf: self)
        monkeypatch.setattr(run, "sync_gateway_now", lambda *a, **k: self.calls.append(("sync",)))

    def acquire(self, fleet: Any, hosts: list[str], me: Any, **kw: Any) -> Any:
        if self.lock_holder:
            raise lock.LockHeld(
                {hosts[0]: {"holder": self.lock_holder, "pid": 1, "run_id": "op1", "time": "t", "age_s": 3}}
            )
        self.calls.append(("lock", hosts, me.holder))
        return lock.Acquired(list(hosts), {}, {})

    def deploy(
        self,
        inv: Any,
        state_dir: Path,
        mf: Any,
        template: str,
        names: list[str],
        hosts: list[str],
        policy: Any,
        me: Any,
        say: Any,
    ) -> Any:
        st = StateStore(state_dir).load()
        self.calls.append(("deploy", sorted(names), st.replicas.get(template), dict(self.marks)))
        where = run.template_replicas(inv, st, template)
        gate = lambda n: SimpleNamespace(instance=n, ok=self.gates_ok, reason="health: timed out after 60 s")
        outs = {}
        for n, i in where.items():
            h = i.placement[0].host
            outs.setdefault(
                h,
                SimpleNamespace(
                    status="applied" if self.gates_ok else "rolled_back",
                    gates=[],
                    error=None if self.gates_ok else "gate failed",
                    drained={},
                ),
            )
            outs[h].gates.append(gate(n))
        return SimpleNamespace(ok=self.gates_ok, result="ok" if self.gates_ok else "rolled_back", hosts=outs)

    # the gateway hook
    def mark_down_many(self, names: list[str], reason: str) -> None:
        self.calls.append(("down", sorted(names), reason))
        self.marks.update({n: reason for n in names})

    def mark_up_many(self, names: list[str]) -> None:
        self.calls.append(("up", sorted(names)))
        for n in names:
            self.marks.pop(n, None)


def _signals(monkeypatch: pytest.MonkeyPatch, value: float | None) -> None:
    def measure(inv: Any, sd: Path, mf: Any, template: str, policy: Any, on_event: Any = None) -> Any:
        st = StateStore(sd).load()
        names = list(run.template_replicas(inv, st, template))
        return run.Signals(len(names), tuple(run.ReplicaSignal(n, "serving", value) for n in names))

    monkeypatch.setattr(run, "measure", measure)


def test_scale_out_marks_new_replicas_down_until_their_gates_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inv = inv_with()
    fake = Fake(monkeypatch, tmp_path)
    _signals(monkeypatch, 0.95)
    out = run.decide_template(inv, tmp_path, make_fleet, "pool", inv.templates["pool"].autoscale, now=lambda: 1000.0)
    # 1 replica at 0.95: 0.95 / band middle 0.5 = 1.9 replicas' worth -> one more
    assert (out.decision.action, out.decision.target, out.outcome) == ("out", 2, "ok"), out.detail
    kinds = [c[0] for c in fake.calls]
    assert kinds == ["lock", "down", "deploy", "up", "sync", "release"]
    assert fake.calls[0][2].startswith("autoscaler:")
    assert fake.calls[1] == ("down", ["pool-2"], run.STARTING_REASON)
    # the engine ran with the new count recorded and the new replica still marked down
    assert fake.calls[2][2] == 2 and set(fake.calls[2][3]) == {"pool-2"}
    assert StateStore(tmp_path).load().replicas["pool"] == 2 and not fake.marks
    hist = record.read_history(tmp_path)
    assert [(h["action"], h["outcome"], h["rule"], h["value"]) for h in hist] == [("out", "ok", "above-high", 0.95)]
    assert record.load_states(tmp_path)["pool"].last_action == "out"


def test_failed_scale_out_is_undone_and_backs_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv = inv_with("backoff_s: 100\n")
    fake = Fake(monkeypatch, tmp_path, gates_ok=False)
    _signals(monkeypatch, 0.95)
    pol = inv.templates["pool"].autoscale
    out = run.decide_template(inv, tmp_path, make_fleet, "pool", pol, now=lambda: 1000.0)
    assert out.outcome == "failed" and "health: timed out" in (out.detail or "")
    st = StateStore(tmp_path).load()
    assert st.replicas["pool"] == 1 and set(st.placements["pool"]) == {"pool-1"}  # count and places restored
    assert not fake.marks  # the starting marks are gone with the replicas
    s = record.load_states(tmp_path)["pool"]
    assert (s.failures, s.backoff_until) == (1, 1100.0)
    again = run.decide_template(inv, tmp_path, make_fleet, "pool", pol, now=lambda: 1050.0)
    assert (again.decision.rule, again.outcome) == ("backoff", "none")


def test_an_operators_lock_wins_and_nothing_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv = inv_with()
    fake = Fake(monkeypatch, tmp_path, lock_holder="alice@ctl")
    _signals(monkeypatch, 0.95)
    out = run.decide_template(inv, tmp_path, make_fleet, "pool", inv.templates["pool"].autoscale, now=lambda: 5.0)
    assert out.outcome == "waited" and "alice@ctl" in (out.detail or "")
    assert "pool" not in StateStore(tmp_path).load().replicas and not [c for c in fake.calls if c[0] != "release"]
    assert record.load_states(tmp_path)["pool"].last_action_at is None  # no cooldown: it acts next round
    assert record.read_history(tmp_path)[-1]["outcome"] == "waited"


def scale_in_round(
    inv: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, template: str, replicas: int
) -> tuple[Fake, Any]:
    """``template`` placed at ``replicas``, every replica idle long enough: one round (a scale-in)."""
    from clusterctl.deploy.placement.place import desired_instances

    store = StateStore(tmp_path)
    with store.update() as st:
        st.replicas[template] = replicas
    store.save_placements(desired_instances(inv, store.load()).state.placements)
    fake = Fake(monkeypatch, tmp_path)
    _signals(monkeypatch, 0.05)
    record.save_states(tmp_path, {template: ScalerState(below_since=0.0)})
    pol = inv.templates[template].autoscale
    return fake, run.decide_template(inv, tmp_path, make_fleet, template, pol, now=lambda: 900.0)


def test_scale_in_drains_through_the_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv = inv_with()
    fake, out = scale_in_round(inv, tmp_path, monkeypatch, "pool", 3)
    assert (out.decision.action, out.outcome, out.removed) == ("in", "ok", ["pool-3", "pool-2"])
    assert fake.calls[1][0] == "deploy" and fake.calls[1][2] == 1  # count recorded before the engine drains
    assert not any(c[0] == "down" for c in fake.calls)  # the engine's drain marks them down, not the autoscaler


def test_plan_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inv = inv_with()
    fake = Fake(monkeypatch, tmp_path)
    _signals(monkeypatch, 0.95)
    outs = run.run_round(inv, tmp_path, make_fleet, {"pool": inv.templates["pool"].autoscale}, plan_only=True)
    assert outs[0].decision.action == "out" and outs[0].outcome == "planned"
    assert fake.calls == [] and record.read_history(tmp_path) == [] and record.load_states(tmp_path) == {}


def test_one_decision_at_a_time(tmp_path: Path) -> None:
    with record.deciding(tmp_path):
        with pytest.raises(record.AutoscaleBusy):
            with record.deciding(tmp_path, wait_s=0.3):
                pass
