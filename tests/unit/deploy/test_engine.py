"""The rollout logic of the deploy engine over fake hosts (FakeTransport) with scripted gates.

Hosts answer the node program's jobs from a table; gates are replaced
through the engine's ``gate`` hook, so the batch, failure-tolerance and
rollback decisions are tested without systemd or HTTP.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence


from clusterctl.deploy.rollout import audit
from clusterctl.deploy.rollout.engine import Deploy, DeployOptions
from clusterctl.deploy.rollout.gates import GateResult
from clusterctl.deploy.rollout.batches import parse_serial
from clusterctl.fleet import Fleet
from clusterctl.fleet.transport import FakeReply, FakeTransport
from clusterctl.inventory.loader import load_inventory_text
from clusterctl.inventory.model import Host

N = 8
INVENTORY = f"""\
version: 1
defaults:
  gpus: {{count: 1, model: H100-SXM5-80GB, memory_gib: 79.6, interconnect: nvlink}}
hosts:
  h[01-0{N}]: {{address: '10.0.0.[1-{N}]'}}
engines:
  e: {{path: /opt/vllm/bin/vllm, version: 0.11.0}}
models:
  m: {{path: /models/m}}
instances:
""" + "".join(f"  i{n}: {{model: m, engine: e, placement: 'h0{n}:0', port: 8000}}\n" for n in range(1, N + 1))


class FakeCluster:
    """Hosts with no instances; ``bad_gate`` / ``bad_apply`` hosts fail; every job is recorded."""

    def __init__(self, bad_gate: Sequence[str] = (), bad_apply: Sequence[str] = ()):
        self.bad_gate, self.bad_apply = set(bad_gate), set(bad_apply)
        self.jobs: list[tuple[str, dict[str, Any]]] = []
        self.transport = FakeTransport(self.handle)

    def handle(self, host: Host, command: str, stdin: bytes | None) -> FakeReply:
        job = json.loads((stdin or b"{}").decode().splitlines()[0])
        self.jobs.append((host.name, job))
        op = job["op"]
        if op == "read":
            out: dict[str, Any] = {"ok": True, "instances": {}, "lock": None, "previous": [], "models": {}}
        elif op == "apply" and host.name in self.bad_apply:
            out = {"ok": False, "kind": "systemctl", "error": "systemctl start failed"}
        elif op == "rollback":
            out = {"ok": True, "restored": [], "removed": job["instances"], "missing": []}
        else:
            out = {"ok": True, "recovered": None}
        return FakeReply(0, json.dumps(out) + "\n")

    def ops(self, op: str) -> list[str]:
        return [h for h, j in self.jobs if j["op"] == op]


class ScriptedDeploy(Deploy):
    def preflight(self, fleet: Any, plan: Any) -> Any:
        return None

    def gate(self, fleet: Any, names: Sequence[str]) -> list[GateResult]:
        bad = self.cluster.bad_gate  # type: ignore[attr-defined]
        return [
            GateResult(n, self.rendered[n].host, self.rendered[n].host not in bad, "completion", "scripted", 0.0)
            for n in names
        ]


def run(tmp_path: Path, cluster: FakeCluster, serial: str | None, mfp: float = 0, gateway: Any = None) -> Any:
    inv = load_inventory_text(INVENTORY, "inv.yaml")
    d = ScriptedDeploy(
        inv,
        list(inv.hosts.values()),
        lambda hs: Fleet(list(hs), transport=cluster.transport),
        str(tmp_path),
        DeployOptions(serial=parse_serial(serial), max_fail_percentage=mfp),
        gateway=gateway,
    )
    d.cluster = cluster  # type: ignore[attr-defined]
    return d.run()


def test_all_batches_pass_in_order_and_every_lock_is_released(tmp_path: Path) -> None:
    c = FakeCluster()
    rep = run(tmp_path, c, "1,25%,100%")
    assert rep.result == "ok" and [len(b) for b in rep.batches] == [1, 2, 5]
    applied = c.ops("apply")  # hosts of one batch run in parallel; batches in order
    assert applied[0] == "h01" and sorted(applied[1:3]) == ["h02", "h03"] and sorted(applied) == sorted(rep.hosts)
    assert sorted(c.ops("lock")) == sorted(c.ops("unlock")) == [f"h0{n}" for n in range(1, N + 1)]
    assert c.ops("rollback") == []
    [rec] = audit.read(tmp_path)
    assert rec["result"] == "ok" and len(rec["instances"]) == N
    t = rep.to_dict()["timings"]  # every phase timed, per batch too (the release benchmark reads them)
    assert {"prepare_s", "preflight_s", "lock_s", "reread_s", "unlock_s", "kv_checks_s"} <= set(t)
    assert [(b["batch"], b["hosts"]) for b in t["batches"]] == [(1, 1), (2, 2), (3, 5)]
    phases = ("stage_s", "drain_s", "mark_down_s", "apply_s", "gate_s", "mark_up_s")
    for b in t["batches"]:
        assert all(b[k] >= 0 for k in phases) and b["mark_downs"] == 0  # no gateway here
        assert sum(b[k] for k in phases if k != "mark_down_s") <= b["seconds"] + 0.01


def test_a_failing_canary_is_rolled_back_and_no_other_host_is_touched(tmp_path: Path) -> None:
    c = FakeCluster(bad_gate=["h01"])
    rep = run(tmp_path, c, "1,100%")
    assert rep.result == "rolled_back"
    assert c.ops("apply") == ["h01"] and c.ops("rollback") == ["h01"]
    rb = next(j for h, j in c.jobs if j["op"] == "rollback")
    assert rb["run_id"] == rep.run_id  # only this run's copies are restored
    assert {h: o.status for h, o in rep.hosts.items()} == {
        "h01": "rolled_back",
        **{f"h0{n}": "not_reached" for n in range(2, N + 1)},
    }
    assert len(c.ops("unlock")) == N and audit.read(tmp_path)[-1]["result"] == "rolled_back"


def test_failures_within_max_fail_percentage_roll_back_only_those_hosts_and_go_on(tmp_path: Path) -> None:
    c = FakeCluster(bad_gate=["h02"])  # batches of 4: 1 of 4 = 25 % is not more than 25
    rep = run(tmp_path, c, "4", mfp=25)
    assert rep.result == "partial" and c.ops("rollback") == ["h02"]
    assert len(c.ops("apply")) == N and rep.hosts["h02"].status == "failed"
    assert all(o.status == "applied" for h, o in rep.hosts.items() if h != "h02")


def test_exceeding_max_fail_percentage_rolls_back_the_whole_batch(tmp_path: Path) -> None:
    c = FakeCluster(bad_gate=["h05"], bad_apply=["h06"])  # 2 of 4 = 50 % > 25
    rep = run(tmp_path, c, "4", mfp=25)
    assert rep.result == "rolled_back"
    assert sorted(c.ops("rollback")) == ["h05", "h06", "h07", "h08"]
    assert all(rep.hosts[f"h0{n}"].status == "applied" for n in range(1, 5))  # earlier batch stays


def test_plan_only_applies_and_locks_nothing(tmp_path: Path) -> None:
    c = FakeCluster()
    inv = load_inventory_text(INVENTORY, "inv.yaml")
    rep = ScriptedDeploy(
        inv,
        list(inv.hosts.values()),
        lambda hs: Fleet(list(hs), transport=c.transport),
        str(tmp_path),
        DeployOptions(plan_only=True),
    ).run()
    assert rep.result == "planned" and rep.plan.counts()["new"] == N
    assert {j["op"] for _, j in c.jobs} == {"read"} and audit.read(tmp_path) == []


def test_the_gate_uses_the_key_systemd_reads_and_the_served_name_the_unit_passes() -> None:
    from clusterctl.deploy import spec
    from clusterctl.deploy.rollout.engine import api_key, instance_served_name
    from clusterctl.deploy.units.sdquote import env_file_line

    inv = load_inventory_text(INVENTORY, "inv.yaml")
    for value in ("sk-123", 'a"b\\c$d`e'):
        r = spec.RenderedInstance(
            "i1",
            "h01",
            "",
            "# env\n" + env_file_line("VLLM_API_KEY", value) + "\n",
            8000,
            (0,),
            "m",
            "/models/m",
            None,
            "e",
            "0.11.0",
        )
        assert api_key(r) == value
        assert instance_served_name(inv, inv.instances["i1"], r) == "m"
        inv.instances["i1"].args["served-model-name"] = ["alias", "other"]
        assert instance_served_name(inv, inv.instances["i1"], r) == "alias"
        del inv.instances["i1"].args["served-model-name"]


class JournalCluster(FakeCluster):
    """Also answers the post-start journal read: every started instance logged 1,010 KV tokens,
    except on ``silent`` hosts (still loading: no KV line yet)."""

    def __init__(self, silent: Sequence[str] = ()):
        super().__init__()
        self.silent = set(silent)

    def handle(self, host: Host, command: str, stdin: bytes | None) -> FakeReply:
        if "clusterctl-kvcheck" not in command:  # the kvcheck journal read (not the node program)
            return super().handle(host, command, stdin)
        names = [p.split("clusterctl-kvcheck ")[1].split("'")[0] for p in command.split("echo ")[1:]]
        out = "".join(
            f"=== clusterctl-kvcheck {n}\n"
            + (
                ""
                if host.name in self.silent
                else "(EngineCore_DP0 pid=7) INFO [kv_cache_utils.py:1087] GPU KV cache size: 1,010 tokens\n"
            )
            for n in names
        )
        return FakeReply(0, out)


class PredictingDeploy(ScriptedDeploy):
    def preflight(self, fleet: Any, plan: Any) -> Any:
        class Report:
            def predictions(self) -> dict[str, tuple[str, int]]:
                return {f"i{n}": (f"h0{n}", 1000) for n in range(1, N + 1)}

            def to_json(self) -> dict[str, Any]:
                return {}

        return Report()


def test_after_start_the_kv_capacity_vllm_logged_is_compared_with_the_prediction(tmp_path: Path) -> None:
    inv = load_inventory_text(INVENTORY, "inv.yaml")
    cluster = JournalCluster(silent=["h03"])
    d = PredictingDeploy(
        inv,
        list(inv.hosts.values()),
        lambda hs: Fleet(list(hs), transport=cluster.transport),
        str(tmp_path),
        DeployOptions(serial=parse_serial("4")),
    )
    d.cluster = cluster  # type: ignore[attr-defined]
    rep = d.run()
    assert rep.result == "ok" and set(rep.kv_checks) == {f"i{n}" for n in range(1, N + 1)}
    assert rep.kv_checks["i1"] == {
        "predicted_tokens": 1000,
        "logged_tokens": 1010,
        "per_rank": [1010],
        "error_pct": -0.99,
    }
    assert rep.kv_checks["i3"]["logged_tokens"] is None  # nothing logged yet: no error figure
    assert rep.to_dict()["kv_checks"]["i1"]["error_pct"] == -0.99
