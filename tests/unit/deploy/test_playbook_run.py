"""Running a playbook over recorded host state: which node jobs each step sends, what a failure
rolls back (and whether it restarts), what stops the run.

Hosts are not reached: ``remote.read_hosts`` answers with recorded state
(playbook_fakes), the lock, apply and rollback node jobs are recorded, the
standard gate passes (its checks have their own tests), and ``exec`` steps and
gates run through a Fleet over FakeTransport whose hosts answer with the exit
status the test chose.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from clusterctl.deploy.rollout import apply as ap
from clusterctl.deploy.rollout import gates, lock
from clusterctl.deploy.rollout.engine import DeployOptions
from clusterctl.deploy.playbooks.load import parse_playbook
from clusterctl.deploy.playbooks.run import PlaybookReport, PlaybookRun
from clusterctl.deploy.remote import NodeReply
from clusterctl.fleet import Fleet
from clusterctl.fleet.transport import FakeReply, FakeTransport
from clusterctl.inventory.loader import load_inventory
from tests.unit.deploy.playbook_fakes import recorded  # noqa: F401  (fixture)


class Nodes:
    """Records the node jobs; ``exec_rc[host]`` is what exec commands exit with there."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.applied: list[tuple[str, dict[str, Any]]] = []
        self.rolled_back: list[tuple[str, list[str], bool]] = []
        self.commands: list[tuple[str, str]] = []
        self.exec_rc: dict[str, int] = {}
        self.released: list[str] = []
        self.transport = FakeTransport(self.handle)
        monkeypatch.setattr(lock, "acquire", lambda fleet, hosts, me, **kw: lock.Acquired(list(hosts), {}, {}))
        monkeypatch.setattr(lock, "release_anyway", lambda fleet, hosts, *a, **kw: self.released.extend(hosts))
        monkeypatch.setattr(ap, "drain_before", lambda *a, **kw: {})
        monkeypatch.setattr(ap, "apply_hosts", self.apply)
        monkeypatch.setattr(ap, "rollback_hosts", self.rollback)
        monkeypatch.setattr(
            gates,
            "wait_gates",
            lambda targets, **kw: [
                gates.GateResult(t.instance, t.host, True, "completion", "ok", 0.0) for t in targets
            ],
        )

    def handle(self, host: Any, command: str, stdin: bytes | None) -> FakeReply:
        self.commands.append((host.name, command))
        return FakeReply(self.exec_rc.get(host.name, 0), "", "")

    def apply(self, fleet: Any, jobs: dict[str, dict[str, Any]], on_reply: Any = None) -> dict[str, NodeReply]:
        self.applied += [(h, j) for h, j in jobs.items()]
        return {h: NodeReply(h, True) for h in jobs}

    def rollback(
        self,
        fleet: Any,
        instances: dict[str, list[str]],
        *,
        own_run_id: str,
        only_run_id: str | None = None,
        restart: bool = True,
    ) -> dict[str, NodeReply]:
        assert only_run_id == own_run_id  # only what this run saved
        self.rolled_back += [(h, sorted(names), restart) for h, names in instances.items()]
        return {h: NodeReply(h, True) for h in instances}

    def fleet(self, hosts: Any) -> Fleet:
        return Fleet(list(hosts), transport=self.transport)

    def jobs(self) -> list[tuple[str, list[str], list[str], list[str]]]:
        """(host, written, restarted, started) per apply job, in order."""
        return [(h, [w["instance"] for w in j["write"]], j["restart"], j["start"]) for h, j in self.applied]


def run(recorded: str, nodes: Nodes, text: str, tmp_path: Path) -> PlaybookReport:
    inv = load_inventory(recorded)
    book = parse_playbook(text, "pb.yaml")
    return PlaybookRun(
        book, inv, list(inv.hosts.values()), nodes.fleet, str(tmp_path / "state"), DeployOptions(gate_timeout_s=5)
    ).run()


def outcomes(rep: PlaybookReport) -> dict[str, str]:
    return {o.name: o.status for o in rep.outcomes}


def audit(tmp_path: Path) -> dict[str, Any]:
    lines = (tmp_path / "state" / "audit.jsonl").read_text().splitlines()
    return json.loads(lines[-1])


UNITS_CANARY_ROLLOUT = """\
steps:
  - {kind: units}
  - kind: canary
    gates:
      - exec: {command: 'check "$INSTANCE"'}
        timeout: 0.1
  - {kind: rollout, serial: '1,25%,100%'}
  - {kind: gates}
"""


def test_units_then_canary_then_rollout(recorded: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = Nodes(monkeypatch)
    rep = run(recorded, nodes, UNITS_CANARY_ROLLOUT, tmp_path)
    assert rep.deploy.result == "ok" and outcomes(rep) == {
        "units": "ok",
        "canary": "ok",
        "rollout": "ok",
        "gates": "ok",
    }
    assert rep.deploy.batches == [["h2"], ["h3"], ["h4", "h5"]]
    # units writes (a4 only needs a start: nothing to write) and starts nothing; the batches then
    # restart and start without writing again (the previous copies stay the units step's).
    assert nodes.jobs() == [
        ("h2", ["a2"], [], []),
        ("h3", ["a3"], [], []),
        ("h2", [], ["a2"], []),
        ("h3", [], [], ["a3"]),
        ("h4", [], [], ["a4"]),
        ("h5", [], [], []),
    ]
    assert nodes.applied[-1][1]["remove"] == ["gone"] and nodes.applied[0][1]["remove"] == []
    assert [c for c in nodes.commands if "check" in c[1]] == [
        ("h2", "INSTANCE=a2 PORT=8100 ADDRESS=127.0.0.2; export INSTANCE PORT ADDRESS; check \"$INSTANCE\"")
    ]
    assert nodes.rolled_back == [] and sorted(nodes.released) == ["h2", "h3", "h4", "h5"]
    assert audit(tmp_path)["result"] == "ok"


def test_a_failing_custom_gate_rolls_back_the_canary_and_puts_back_unreached_files_without_restart(
    recorded: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = Nodes(monkeypatch)
    nodes.exec_rc["h2"] = 1
    rep = run(recorded, nodes, UNITS_CANARY_ROLLOUT, tmp_path)
    assert rep.deploy.result == "rolled_back" and not rep.ok
    assert outcomes(rep) == {"units": "ok", "canary": "failed", "rollout": "skipped", "gates": "skipped"}
    assert nodes.rolled_back == [("h2", ["a2"], True), ("h3", ["a3"], False)]
    status = {h: o.status for h, o in rep.deploy.hosts.items()}
    assert status == {
        "h1": "unchanged",
        "h2": "rolled_back",
        "h3": "not_reached",
        "h4": "not_reached",
        "h5": "not_reached",
    }
    assert (rep.deploy.hosts["h2"].error or "").startswith("a2: custom gate exec 'check \"$INSTANCE\"'")
    assert [h for h, *_ in nodes.jobs()] == ["h2", "h3", "h2"]  # units on h2, h3; the canary; nothing more
    assert audit(tmp_path)["result"] == "rolled_back" and "'canary' failed" in audit(tmp_path)["detail"]


@pytest.mark.parametrize("mfp,result,jobs", [(0, "stopped", 0), (25, "partial", 3)])
def test_an_exec_step_is_judged_with_max_fail_percentage(
    recorded: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mfp: int, result: str, jobs: int
) -> None:
    nodes = Nodes(monkeypatch)
    nodes.exec_rc["h3"] = 2
    rep = run(
        recorded,
        nodes,
        f"""steps:
  - {{kind: exec, command: 'probe', hosts: 'h[2-5]', max_fail_percentage: {mfp}}}
  - {{kind: rollout, hosts: 'h[2-4]'}}
""",
        tmp_path,
    )
    assert rep.deploy.result == result
    assert sorted(h for h, c in nodes.commands if "probe" in c) == ["h2", "h3", "h4", "h5"]
    assert len(nodes.applied) == jobs and nodes.rolled_back == []
    exec_outcome = rep.outcomes[0]
    assert exec_outcome.hosts.get("h3", exec_outcome.note).count("exit status 2, expected 0") == 1


def test_a_failing_gates_step_rolls_back_what_the_run_rolled_out(
    recorded: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = Nodes(monkeypatch)
    nodes.exec_rc["h4"] = 1
    rep = run(
        recorded,
        nodes,
        """steps:
  - {kind: rollout}
  - kind: gates
    gates: [{exec: {command: 'verify'}, timeout: 0.1}]
""",
        tmp_path,
    )
    assert rep.deploy.result == "rolled_back" and outcomes(rep) == {"rollout": "ok", "gates": "failed"}
    assert nodes.rolled_back == [("h2", ["a2"], True), ("h3", ["a3"], True), ("h4", [], True)]
    assert "h5" not in [h for h, *_ in nodes.rolled_back]  # nothing started there (only a removal)


def test_nothing_to_change_runs_no_step(recorded: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nodes = Nodes(monkeypatch)
    rep = run(
        recorded,
        nodes,
        "steps:\n  - {kind: exec, command: probe, hosts: h1}\n  - {kind: rollout, hosts: h1}\n",
        tmp_path,
    )
    # h1 has nothing to change, but the run as a whole does: the exec step runs, the rollout has nothing.
    assert outcomes(rep) == {"exec": "ok", "rollout": "skipped"} and nodes.applied == []


def test_preflight_refusing_after_units_puts_the_files_back(
    recorded: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clusterctl.deploy.rollout.engine import Deploy, PreflightRefused

    def refuse(self: Any, fleet: Any, plan: Any) -> Any:
        raise PreflightRefused("pre-flight refused the deploy", None)

    monkeypatch.setattr(Deploy, "preflight", refuse)
    nodes = Nodes(monkeypatch)
    with pytest.raises(PreflightRefused):
        run(recorded, nodes, "steps:\n  - {kind: units}\n  - {kind: preflight}\n  - {kind: rollout}\n", tmp_path)
    assert nodes.rolled_back == [("h2", ["a2"], False), ("h3", ["a3"], False)]
    assert sorted(nodes.released) == ["h2", "h3", "h4", "h5"]
    assert audit(tmp_path)["result"] == "refused"


def test_a_bench_gates_reference_is_an_inventory_instance_with_its_key(
    recorded: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clusterctl.errors import ClusterctlError
    from tests.unit.deploy.playbook_fakes import KEY

    nodes = Nodes(monkeypatch)
    inv = load_inventory(recorded)
    pr = PlaybookRun(
        parse_playbook("steps:\n  - {kind: rollout}\n", "pb.yaml"),
        inv,
        [inv.hosts["h1"]],
        nodes.fleet,
        str(tmp_path / "state"),
        DeployOptions(),
    )
    with nodes.fleet([inv.hosts["h1"]]) as fleet:
        pr.dep.prepare(fleet)
    assert pr.dep.reference("a3") == ("http://127.0.0.3:8100", KEY)  # on a host outside the selection too
    with pytest.raises(ClusterctlError, match="no instance 'zz'"):
        pr.dep.reference("zz")
