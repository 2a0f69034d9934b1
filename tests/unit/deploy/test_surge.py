"""``deploy --surge`` over fake hosts (FakeTransport) that keep their units, a fake gateway and scripted gates.

Every node job, gate and gateway change goes into one timeline, so the tests check the order an
operator relies on: the new version serves at the gateway before the old one is drained and
stopped, and some replica of each instance serves at every moment.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import pytest

from clusterctl.deploy.rollout import drain as dr
from clusterctl.deploy.rollout.engine import DeployOptions
from clusterctl.deploy.rollout.gates import GateResult
from clusterctl.deploy.rollout.batches import parse_serial
from clusterctl.deploy.rollout.surge import SurgeDeploy, SurgeRefused, plan_surges, step_line
from clusterctl.fleet import Fleet
from clusterctl.fleet.transport import FakeReply, FakeTransport
from clusterctl.inventory.loader import load_inventory_text
from clusterctl.inventory.model import Host
from clusterctl.node.deploy import _x_section, digest_of, env_hashes

INVENTORY = """\
version: 1
defaults:
  gpus: {count: 2, model: H100-SXM5-80GB, memory_gib: 79.6, interconnect: nvlink}
hosts:
  h01: {address: 127.0.0.1}
  h02: {address: 127.0.0.1}
  h03: {address: 127.0.0.1, gpus: {count: 1}}
engines:
  e: {path: /opt/vllm/bin/vllm, version: 0.11.0}
models:
  m: {path: /models/m}
instances:
  a: {model: m, engine: e, placement: 'h01:0', port: 18101, args: {max-model-len: MLEN}}
  b: {model: m, engine: e, placement: 'h02:0', port: 18102, args: {max-model-len: MLEN}}
  c: {model: m, engine: e, placement: 'h03:0', port: 18103, args: {max-model-len: MLEN}}
gateway:
  hosts: h01
  port: 8080
"""


def inventory(mlen: int = 1024, gateway: bool = True) -> Any:
    text = INVENTORY.replace("MLEN", str(mlen))
    return load_inventory_text(text if gateway else text[: text.index("gateway:")], "inv.yaml")


class Cluster:
    """Hosts that keep their units (unit text, env, active) and ``previous/`` copies; one timeline of
    everything done (``log``); gates of ``bad`` instances fail."""

    def __init__(self, bad: Sequence[str] = ()):
        self.units: dict[str, dict[str, dict[str, Any]]] = {"h01": {}, "h02": {}, "h03": {}}
        self.previous: dict[str, dict[str, Any]] = {"h01": {}, "h02": {}, "h03": {}}
        self.relinked: list[tuple[str, dict[str, str]]] = []
        self.log: list[str] = []
        self.bad = set(bad)
        self.transport = FakeTransport(self.handle)

    def handle(self, host: Host, command: str, stdin: bytes | None) -> FakeReply:
        job = json.loads((stdin or b"{}").decode().splitlines()[0])
        h, units, prev = host.name, self.units[host.name], self.previous[host.name]
        op = job["op"]
        out: dict[str, Any] = {"ok": True}
        if op == "read":
            out = {
                "ok": True,
                "lock": None,
                "previous": sorted(f"{n}.service" for n in prev),
                "models": {},
                "instances": {
                    n: {
                        "unit_text": u["unit_text"],
                        "x": _x_section(u["unit_text"]),
                        "env_present": True,
                        "digest": digest_of(u["unit_text"], u["env_text"]),
                        "env_hashes": env_hashes(u["env_text"], job.get("salt", "")),
                        "active": u["active"],
                        "sub": "running",
                        "restarts": 0,
                        "main_pid": 1,
                        "enabled": "enabled",
                        "started_mono": 1,
                    }
                    for n, u in units.items()
                },
            }
        elif op == "apply":
            for w in job["write"]:
                prev[w["instance"]] = (
                    dict(units[w["instance"]], run=job["run_id"])
                    if w["instance"] in units
                    else {"absent": True, "run": job["run_id"]}
                )
                units[w["instance"]] = {"unit_text": w["unit_text"], "env_text": w["env_text"], "active": "inactive"}
            for n in job["remove"]:
                prev[n] = dict(units.pop(n), run=job["run_id"])
                self.log.append(f"{h} stop {n}")
            for n in job.get("forget", []):
                prev.pop(n, None)
            self.relinked += [(h, m) for m in job.get("relink", [])]
            for n in job["restart"] + job["start"]:
                units[n]["active"] = "active"
                self.log.append(f"{h} {'restart' if n in job['restart'] else 'start'} {n}")
        elif op == "rollback":
            restored, removed = [], []
            for n in job["instances"]:
                p = prev.get(n)
                if p is None or (job.get("run_id") and p["run"] != job["run_id"]):
                    continue
                if p.get("absent"):
                    units.pop(n, None)
                    removed.append(n)
                else:
                    units[n] = {"unit_text": p["unit_text"], "env_text": p["env_text"], "active": "active"}
                    restored.append(n)
                    self.log.append(f"{h} restore {n}")
            out = {"ok": True, "restored": restored, "removed": removed, "missing": []}
        return FakeReply(0, json.dumps(out) + "\n")

    def max_model_len(self, host: str, name: str) -> int:
        text = self.units[host][name]["unit_text"]
        return int(text.split("--max-model-len ")[1].split()[0])


class Gateway:
    """The drain hook: who the gateway would send requests to after each change goes into the timeline."""

    def __init__(self, cluster: Cluster, inv: Any):
        self.cluster, self.down = cluster, {}  # type: ignore[var-annotated]
        self.instances = lambda: dict(inv.instances)

    def _apply(self, names: Sequence[str], down: bool) -> None:
        for n in names:
            if down:
                self.down[n] = dr.DRAIN_REASON
            else:
                self.down.pop(n, None)
        self.cluster.log.append("gw " + ",".join(sorted(n for n in self.instances() if n not in self.down)))

    def mark_down(self, name: str) -> None:
        self._apply([name], True)

    def mark_up(self, name: str) -> None:
        self._apply([name], False)

    def mark_up_many(self, names: Sequence[str]) -> None:
        self._apply(names, False)

    def marked(self) -> dict[str, str]:
        return dict(self.down)


class Scripted(SurgeDeploy):
    def preflight(self, fleet: Any, plan: Any) -> Any:
        return None

    def gate(self, fleet: Any, names: Sequence[str]) -> list[GateResult]:
        c: Cluster = self.cluster  # type: ignore[attr-defined]
        out = []
        for n in names:
            ok = n not in c.bad
            c.log.append(f"gate {n} {'ok' if ok else 'FAIL'}")
            out.append(GateResult(n, self.rendered[n].host, ok, "completion", "scripted" if ok else "no answer", 0.0))
        return out

    def restore_gates(self, fleet: Any, replies: Any, rep: Any) -> None:
        restored = [n for r in replies.values() if r.ok for n in r.data.get("restored", [])]
        self.put_back([g.instance for g in self.gate(fleet, restored) if g.ok], rep)


@pytest.fixture(autouse=True)
def nothing_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dr, "fetch_sample", lambda url, timeout=0: "ConnectionRefusedError: refused")
    monkeypatch.setattr(dr, "SETTLE_S", 0.0)


def deploy(
    tmp_path: Path,
    cluster: Cluster,
    mlen: int,
    mode: str = "auto",
    plan_only: bool = False,
    serial: str | None = None,
    gateway: bool = True,
) -> Any:
    inv = inventory(mlen, gateway)
    d = Scripted(
        inv,
        list(inv.hosts.values()),
        lambda hs: Fleet(list(hs), transport=cluster.transport),
        str(tmp_path),
        DeployOptions(serial=parse_serial(serial), surge=mode, plan_only=plan_only, drain_timeout_s=0),
    )
    d.cluster = cluster  # type: ignore[attr-defined]
    if gateway:
        d._gateway = Gateway(cluster, inv)
    return d


def first_deploy(tmp_path: Path, cluster: Cluster) -> None:
    rep = deploy(tmp_path, cluster, 1024, mode="").run()
    assert rep.result == "ok"
    cluster.log.clear()


def test_a_replica_surges_on_spare_gpus_and_the_old_one_serves_until_the_new_passed(tmp_path: Path) -> None:
    c = Cluster()
    first_deploy(tmp_path, c)
    rep = deploy(tmp_path, c, 2048, serial="1").run()
    assert rep.result == "ok", rep.to_dict()
    steps = {s["instance"]: s for s in rep.surge}
    assert steps["a"]["mode"] == "surge" and steps["a"]["gpus"] == [1] and steps["a"]["outcome"] == "done"
    assert steps["a"]["port"] == 18102  # the next port no instance on h01 uses (b has it, on h02)
    assert steps["c"]["mode"] == "in_place" and steps["c"]["why"] == "no spare GPUs: needs 1, 0 free"
    log = c.log
    a = [e for e in log if " a" in e or e.startswith("gw")]
    i = log.index
    # a.surge starts, passes its gate and serves at the gateway before a is marked down and restarted
    assert (
        i("h01 start a.surge")
        < i("gate a.surge ok")
        < i("gw a,a.surge,b,c")
        < i("gw a.surge,b,c")
        < i("h01 restart a")
        < i("gate a ok")
    ), a
    # then a is back, a.surge is drained and stopped: names, ports and GPUs as before
    back = i("gw a,a.surge,b,c", i("gate a ok"))
    assert i("gate a ok") < back < i("gw a,b,c", back) < i("h01 stop a.surge")  # a.surge drained, then stopped
    assert c.max_model_len("h01", "a") == 2048 and set(c.units["h01"]) == {"a"}
    assert "a.surge" not in c.previous["h01"]  # rollback never brings a surge unit back
    # at every moment each instance had a serving copy at the gateway
    for e in log:
        if e.startswith("gw "):
            serving = set(e[3:].split(","))
            assert {"a", "a.surge"} & serving and {"b", "b.surge"} & serving, e
    # c had no spare GPU: restarted in place, as without --surge
    assert "h03 restart c" in log and not any("c.surge" in e for e in log)
    assert [s for s in map(step_line, rep.surge) if s.startswith("h01")] == [
        "h01 a: start a.surge on GPU 1 port 18102, gate it, add it at the gateway; drain a, restart it in place, "
        "gate, put back; drain and remove a.surge -> done"
    ]


def test_a_surge_that_fails_its_gate_is_removed_and_the_old_one_never_stopped(tmp_path: Path) -> None:
    c = Cluster(bad=["a.surge"])
    first_deploy(tmp_path, c)
    rep = deploy(tmp_path, c, 2048, serial="1,100%").run()
    assert rep.result == "rolled_back"
    assert not any(e in c.log for e in ("h01 restart a", "gw a.surge,b,c")), c.log
    assert "h01 stop a.surge" in c.log and set(c.units["h01"]) == {"a"}
    assert c.units["h01"]["a"]["active"] == "active" and c.max_model_len("h01", "a") == 1024
    assert rep.hosts["h01"].status == "rolled_back" and "a.surge: gate: no answer" in rep.hosts["h01"].error
    assert {rep.hosts[h].status for h in ("h02", "h03")} == {"not_reached"}
    assert [s["outcome"] for s in rep.surge if s["mode"] == "surge"] == ["failed", "not_reached"]


def test_when_the_restart_in_place_fails_the_surge_serves_until_the_old_version_is_back(tmp_path: Path) -> None:
    c = Cluster()
    first_deploy(tmp_path, c)
    c.bad = {"a"}
    rep = deploy(tmp_path, c, 2048, serial="1,100%").run()
    assert rep.result == "rolled_back"
    i = c.log.index
    assert i("gate a.surge ok") < i("h01 restart a") < i("gate a FAIL") < i("h01 restore a") < i("h01 stop a.surge")
    assert c.max_model_len("h01", "a") == 1024 and set(c.units["h01"]) == {"a"}


def test_strict_refuses_before_any_host_is_locked_when_a_change_cannot_surge(tmp_path: Path) -> None:
    c = Cluster()
    first_deploy(tmp_path, c)
    with pytest.raises(SurgeRefused, match="h03 c: no spare GPUs: needs 1, 0 free"):
        deploy(tmp_path, c, 2048, mode="strict").run()
    assert c.log == [] and c.max_model_len("h01", "a") == 1024


def test_the_plan_shows_the_surge_steps_and_changes_nothing(tmp_path: Path) -> None:
    c = Cluster()
    first_deploy(tmp_path, c)
    rep = deploy(tmp_path, c, 2048, plan_only=True, mode="strict").run()
    assert rep.result == "planned" and c.log == []
    assert [(s["instance"], s["mode"]) for s in rep.to_dict()["surge"]] == [
        ("a", "surge"),
        ("b", "surge"),
        ("c", "in_place"),
    ]
    rep = deploy(tmp_path, c, 2048, plan_only=True, gateway=False).run()
    assert {s["why"] for s in rep.surge} == {"no gateway in the inventory: nothing would send requests to a surge unit"}


def test_spare_gpus_leave_out_running_units_cordons_and_stopped_instances(tmp_path: Path) -> None:
    from clusterctl.deploy.remote import HostState, InstanceState
    from clusterctl.deploy.rollout.plan import HostPlan, Plan, PlanItem
    from clusterctl.deploy.state import DeployState

    inv = inventory()
    inv.hosts["h01"].gpus.count = 4

    def unit(name: str, gpus: str, port: int, active: str = "active") -> InstanceState:
        return InstanceState(
            name, "", "", {}, True, active, "running", 0, 1, "enabled", 1, {"GPUs": gpus, "Port": str(port)}
        )

    st = HostState("h01", instances={"a": unit("a", "0", 18101), "old": unit("old", "1", 18102)})
    plan = Plan([HostPlan("h01", [PlanItem("a", "h01", "changed")])])
    [s] = plan_surges(inv, plan, inv.instances, {"h01": st})
    assert (s.mode, s.gpus, s.port) == ("surge", (2,), 18103)  # GPU 1 and port 18102: a unit still there
    state = DeployState()
    state.cordons["h01:2"] = {"reason": "ecc"}  # type: ignore[assignment]
    [s] = plan_surges(inv, plan, inv.instances, {"h01": st}, state)
    assert s.gpus == (3,)
    st.instances["a"] = unit("a", "0", 18101, active="failed")
    [s] = plan_surges(inv, plan, inv.instances, {"h01": st})
    assert s.mode == "in_place" and s.why.startswith("not running")


def test_surge_goes_with_the_release_gates() -> None:
    from clusterctl.deploy.rollout.engine import Deploy
    from clusterctl.deploy.rollout.release_gates import ReleaseDeploy, ReleaseGates
    from clusterctl.deploy.rollout.surge import with_surge

    assert with_surge(Deploy) is SurgeDeploy
    cls = with_surge(ReleaseDeploy)
    assert cls.__mro__[1:3] == (SurgeDeploy, ReleaseDeploy)  # surge's batch, the release gates' extra gates
    inv = inventory()
    d = cls(
        inv,
        list(inv.hosts.values()),
        lambda hs: None,
        "/nonexistent",
        DeployOptions(surge="auto"),
        release=ReleaseGates(drift_baseline="previous"),
    )
    assert d.release.drift_baseline == "previous"  # type: ignore[attr-defined]


def test_a_surge_batch_has_one_timings_entry_with_its_surge_steps(tmp_path: Path) -> None:
    """deploy --json's per-batch ``timings`` (what the release benchmarks read): one entry per batch as
    in place, the in-place parts of a surge batch added up in it and the surge's own steps beside."""
    from clusterctl.deploy.rollout.surge import IN_PLACE_PHASES, SURGE_PHASES

    c = Cluster()
    first_deploy(tmp_path, c)
    rep = deploy(tmp_path, c, 2048, serial="1").run()
    assert rep.result == "ok", rep.to_dict()
    batches = rep.to_dict()["timings"]["batches"]
    assert [(b["batch"], b["hosts"]) for b in batches] == [(1, 1), (2, 1), (3, 1)]
    surged = {s["host"] for s in rep.surge if s["mode"] == "surge"}
    assert surged == {"h01", "h02"}  # h03 has no spare GPU: in place
    for b, host in zip(batches, ("h01", "h02", "h03")):
        assert all(b[k] >= 0 for k in IN_PLACE_PHASES) and isinstance(b["mark_downs"], int)
        assert b["gate_s"] >= 0 and b["seconds"] > 0
        if host in surged:
            assert set(SURGE_PHASES) <= set(b)
            assert sum(b[k] for k in (*IN_PLACE_PHASES, *SURGE_PHASES) if k != "mark_down_s") <= b["seconds"] + 0.01
        else:
            assert not set(SURGE_PHASES) & set(b)
