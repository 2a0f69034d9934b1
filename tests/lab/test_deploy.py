"""clusterctl deploy on the 4-host lab: 8 instances of a tiny synthetic model behind real systemd.

One module-scoped deployment (6 template replicas + 2 explicit instances,
all with VLLM_SIM_TIME_SCALE=0) is shared by the tests, which run in file
order: each leaves the hosts as the inventory of ``BASE`` describes them, except the last (the
release case: the next version pre-staged while v1 serves), which leaves it serving.  The fixture's deploy
runs with ``--prestage`` (the second test checks what that promises).
The last fixture step removes every unit, env file, previous copy, lock and
the staged model it created.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml

from clusterctl.deploy.rollout.engine import Deploy, DeployOptions, DeployReport, Event
from clusterctl.deploy.rollout.batches import parse_serial
from clusterctl.fleet import Fleet
from clusterctl.inventory.loader import load_inventory
from support.deploy_lab import remove_deployed, tiny_entry, tiny_model

KEY = "dp-secret-7f3a9c11e2"
KEY_ENV = "CLUSTERCTL_TEST_DEPLOY_KEY"
REPO = Path(__file__).resolve().parents[2]
TEMPLATE = {
    "model": "tiny",
    "engine": "vllm-0.11",
    "replicas": 6,
    "tp": 1,
    "hosts": "all",
    "port_base": 8200,
    "args": {"max-model-len": 2048},
    "env": {"VLLM_SIM_TIME_SCALE": "0"},
    "secrets": {"VLLM_API_KEY": {"env": KEY_ENV}},
}


def explicit(placement: str, port: int, **args: Any) -> dict[str, Any]:
    return {
        "model": "tiny",
        "engine": "vllm-0.11",
        "placement": placement,
        "port": port,
        "args": {"max-model-len": 2048, **args},
        "env": {"VLLM_SIM_TIME_SCALE": "0"},
        "secrets": {"VLLM_API_KEY": {"env": KEY_ENV}},
    }


class World:
    """The lab, the test inventory (rewritten per scenario) and helpers."""

    def __init__(self, lab: Any, root: Path, model_dir: Path):
        self.lab, self.root, self.model_dir = lab, root, model_dir
        self.inv_path = root / "inventory.yaml"
        self.state_dir = root / "state"
        self.base = yaml.safe_load(Path(lab.inventory).read_text())
        #: The fixture's deploy (with --prestage), its events and when it began (time.time()).
        self.first: DeployReport | None = None
        self.first_events: list[Event] = []
        self.first_started = 0.0
        #: host -> the mtime of the file :meth:`placed` was last asked about (time.time() seconds).
        self.marker: dict[str, float] = {}

    def write(self, template: dict[str, Any] | None = None, version: str = "v1", **instances: dict[str, Any]) -> None:
        doc = dict(self.base)
        doc["models"] = {"tiny": tiny_entry(self.model_dir, "/models/dp-tiny", version=version)}
        doc["templates"] = {"pool": template or TEMPLATE}
        first, third = self.lab.names[0], self.lab.names[2]
        doc["instances"] = instances or {"e1": explicit(f"{first}:7", 8300), "e2": explicit(f"{third}:7", 8300)}
        self.inv_path.write_text(yaml.safe_dump(doc, sort_keys=False))

    def deploy(self, on_event: Callable[[Event], None] = lambda e: None, **opts: Any) -> DeployReport:
        inv = load_inventory(str(self.inv_path))
        serial = parse_serial(opts.pop("serial", None))
        o = DeployOptions(serial=serial, gate_timeout_s=opts.pop("gate_timeout_s", 60), **opts)
        return Deploy(inv, list(inv.hosts.values()), self.fleet, str(self.state_dir), o, on_event).run()

    @staticmethod
    def fleet(hosts: Any) -> Fleet:
        return Fleet(list(hosts), connect_timeout=10, command_timeout=120)

    def cli(self, *args: str, state_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, KEY_ENV: KEY, "PYTHONPATH": str(REPO)}
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "clusterctl.cli.main",
                *args,
                "-i",
                str(self.inv_path),
                "--state-dir",
                str(state_dir or self.state_dir),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
        )

    def units(self) -> dict[str, tuple[str, int, int, int]]:
        """instance -> (ActiveState, MainPID, ExecMainStartTimestampMonotonic, NRestarts) on every host."""
        out: dict[str, tuple[str, int, int, int]] = {}
        for text in self.on_hosts(
            "systemctl show -p Id,ActiveState,MainPID,ExecMainStartTimestampMonotonic,NRestarts 'clusterctl-*.service'"
        ).values():
            for block in text.strip().split("\n\n"):
                d = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
                if d.get("Id", "").startswith("clusterctl-"):
                    out[d["Id"][len("clusterctl-") : -len(".service")]] = (
                        d["ActiveState"],
                        int(d["MainPID"]),
                        int(d["ExecMainStartTimestampMonotonic"]),
                        int(d["NRestarts"]),
                    )
        return out

    def on_hosts(self, command: str) -> dict[str, str]:
        """host -> stdout of ``command`` on every lab host (at once; a failed command fails)."""
        with cf.ThreadPoolExecutor(len(self.lab.names)) as ex:
            outs = ex.map(lambda h: self.lab.run(h, command, check=True).stdout, self.lab.names)
            return dict(zip(self.lab.names, outs))

    def placed(self, marker: str = "/dev/null") -> dict[str, dict[str, tuple[int, str, float]]]:
        """host -> instance -> (port, model version, when its unit last entered ``inactive``, in
        CLOCK_MONOTONIC seconds), from each unit's ``[X-Clusterctl]`` section and systemd; also
        sets ``self.marker``: host -> ``marker``'s mtime (time.time() seconds)."""
        script = (
            "for f in /etc/systemd/system/clusterctl-*.service; do n=${f##*/clusterctl-}; n=${n%.service}; "
            "echo U $n $(sed -n 's/^Port=//p' $f) $(sed -n 's/^ModelVersion=//p' $f) "
            "$(systemctl show -p InactiveEnterTimestampMonotonic --value clusterctl-$n.service); done; "
            f"stat -c 'M %.9Y' {marker}"
        )
        out: dict[str, dict[str, tuple[int, str, float]]] = {}
        self.marker = {}
        for host, text in self.on_hosts(script).items():
            for line in text.splitlines():
                w = line.split()
                if w[0] == "U":
                    out.setdefault(host, {})[w[1]] = (int(w[2]), w[3], int(w[4]) / 1e6)
                elif w[0] == "M":
                    self.marker[host] = float(w[1])
        return out

    def where(self) -> dict[str, str]:
        """instance -> the host that has its unit."""
        out = {}
        for host in self.lab.names:
            ls = self.lab.run(host, "ls /etc/systemd/system/ | grep '^clusterctl-.*\\.service$'").stdout
            out.update({u[len("clusterctl-") : -len(".service")]: host for u in ls.split()})
        return out

    def x(self, host: str, instance: str) -> str:
        return self.lab.run(host, f"cat /etc/systemd/system/clusterctl-{instance}.service", check=True).stdout

    def cleanup(self) -> None:
        remove_deployed(
            self.lab,
            "clusterctl-*.service",
            "/etc/clusterctl/instances /var/lib/clusterctl/deploy "
            "/var/lib/clusterctl/deploy.lock /models/dp-tiny /models/.versions/tiny",
        )


@pytest.fixture(scope="module")
def world(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("deploy")
    model_dir = tiny_model(root)
    os.environ[KEY_ENV] = KEY
    w = World(lab, root, model_dir)
    w.cleanup()
    w.write()
    # --prestage: the model staged and warmed on every host before the first batch (checked below)
    w.first_events = []
    w.first_started = time.time()
    rep = w.first = w.deploy(serial="1,100%", prestage=True, on_event=w.first_events.append)
    assert rep.result == "ok", json.dumps(rep.to_dict(), indent=1)[:4000]
    try:
        yield w
    finally:
        w.cleanup()
        os.environ.pop(KEY_ENV, None)


def test_eight_instances_from_a_template_pass_their_gates(world: World) -> None:
    units = world.units()
    assert sorted(units) == ["e1", "e2"] + [f"pool-{n}" for n in range(1, 7)]
    assert all(state == "active" and restarts == 0 for state, _, _, restarts in units.values())
    assert set(world.where().values()) == set(world.lab.names)  # replicas spread over every host


def test_prestage_staged_and_warmed_every_host_before_the_first_batch_started_anything(world: World) -> None:
    """The fixture's deploy ran with ``--prestage``: every host had the version verified (and, by
    the node's own count, in its page cache) before the first unit started, and each batch then
    only switched the model link, in its apply job."""
    rep, hosts = world.first, sorted(world.lab.names)
    assert (
        rep is not None and rep.prestage is not None and rep.prestage["hosts"] == {h: {"tiny": "staged"} for h in hosts}
    )
    assert rep.prestage["resident"] == {h: {"tiny": 1.0} for h in hosts}
    # The version's marker is written once, when it is verified; every unit's first start came after
    # all of them (CLOCK_MONOTONIC is one clock for the lab's containers and here).
    offset = time.time() - time.monotonic()
    marker = "/models/.versions/tiny/v1/.clusterctl-verified"
    verified = {h: float(world.lab.run(h, f"stat -c %.9Y {marker}", check=True).stdout) for h in hosts}
    started = {name: mono / 1e6 + offset for name, (_, _, mono, _) in world.units().items()}
    assert len(started) == 8 and min(started.values()) > world.first_started, started
    assert max(verified.values()) < min(started.values()), (verified, sorted(started.values())[:2])
    # no staging run in a batch: each host's apply pointed the model path at the verified v1
    in_batches = [e for e in world.first_events if e.kind == "host" and e.message.startswith("stage tiny:")]
    assert in_batches == [], [e.message for e in in_batches]
    switched = [e for e in world.first_events if e.kind == "host" and e.message.startswith("switch tiny to v1 in")]
    assert sorted(e.host or "" for e in switched) == hosts, [e.message for e in world.first_events]
    links = {h: world.lab.run(h, "readlink /models/dp-tiny", check=True).stdout.strip() for h in hosts}
    assert links == {h: ".versions/tiny/v1" for h in hosts}, links


def test_second_deploy_restarts_nothing(world: World) -> None:
    before = world.units()
    rep = world.deploy()
    assert rep.result == "nothing" and rep.plan.counts()["unchanged"] == 8
    assert world.units() == before


def test_changing_one_instances_flags_restarts_only_that_one(world: World) -> None:
    before = world.units()
    world.write(
        e1=explicit(f"{world.lab.names[0]}:7", 8300, **{"max-num-seqs": 64}),
        e2=explicit(f"{world.lab.names[2]}:7", 8300),
    )
    plan = world.cli("deploy", "--plan", "--json")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["plan"]["counts"] == {
        "new": 0,
        "changed": 1,
        "start": 0,
        "unchanged": 7,
        "remove": 0,
    }
    rep = world.deploy()
    assert rep.result == "ok" and [i.instance for h in rep.plan.hosts for i in h.changes] == ["e1"]
    after = world.units()
    assert after["e1"][2] != before["e1"][2] and after["e1"][0] == "active"
    assert {k: v for k, v in after.items() if k != "e1"} == {k: v for k, v in before.items() if k != "e1"}
    world.write()
    assert world.deploy().result == "ok"


def test_engine_upgrade_rolls_out_in_batches_and_rollback_restores(world: World) -> None:
    world.write(template={**TEMPLATE, "engine": "vllm-0.33"})
    rep = world.deploy(serial="1,50%")
    assert rep.result == "ok", rep.to_dict()
    assert [len(b) for b in rep.batches] == [1, 2, 1]
    pools = {n: h for n, h in world.where().items() if n.startswith("pool-")}
    assert all("EngineVersion=0.33.0" in world.x(h, n) for n, h in pools.items())
    res = world.cli("rollback", "--instances", "pool-*", "--json", "--gate-timeout", "60")
    assert res.returncode == 0, res.stdout + res.stderr
    assert all("EngineVersion=0.11.0" in world.x(h, n) for n, h in pools.items())
    assert all(state == "active" for state, *_ in world.units().values())
    world.write()
    assert world.deploy().result == "nothing"  # back to what the base inventory says


def test_an_instance_no_longer_wanted_is_removed_and_instances_scopes_removal(world: World) -> None:
    before = world.units()
    world.write(e1=explicit(f"{world.lab.names[0]}:7", 8300))  # e2 is gone from the inventory
    scoped = world.deploy(instances="pool-*")
    assert scoped.result == "nothing" and "e2" in world.units()  # outside --instances: kept
    rep = world.deploy()
    assert rep.result == "ok" and [(i.instance, i.action) for h in rep.plan.hosts for i in h.changes] == [
        ("e2", "remove")
    ]
    assert rep.hosts[world.lab.names[2]].drained == {"e2": "drained"}
    after = world.units()
    assert "e2" not in after and {k: v for k, v in before.items() if k != "e2"} == after
    assert world.lab.run(world.lab.names[2], "test -e /etc/clusterctl/instances/e2.env").returncode != 0
    world.write()
    assert world.deploy().result == "ok" and world.units()["e2"][0] == "active"


@pytest.mark.parametrize("fault", ["dies", "hangs"])
def test_failing_canary_stops_the_rollout_and_rolls_back(world: World, fault: str) -> None:
    before = world.units()
    if fault == "dies":  # longer than the model's 4096 positions: vLLM exits 1 at start; and a new model version
        world.write(template={**TEMPLATE, "args": {"max-model-len": 65536}}, version="v2")
    else:  # every simulated start-up delay x 1000: loading never ends within the gate timeout
        world.write(template={**TEMPLATE, "env": {"VLLM_SIM_TIME_SCALE": "1000"}})
    rep = world.deploy(serial="1", gate_timeout_s=10 if fault == "hangs" else 60, force=True)  # past pre-flight
    assert rep.result == "rolled_back", rep.to_dict()
    canary = rep.batches[0][0]
    assert rep.hosts[canary].status == "rolled_back"
    assert all(rep.hosts[h].status == "not_reached" for b in rep.batches[1:] for h in b)
    after = world.units()
    placed = world.where()
    for name, (state, pid, started, _) in before.items():
        assert after[name][0] == "active", (name, after[name])
        if placed[name] != canary:
            assert after[name][1:3] == (pid, started), name  # hosts not reached: untouched
    links = {
        h: world.lab.run(h, "readlink /models/dp-tiny; ls /models/.versions/tiny", check=True).stdout.split()
        for h in world.lab.names
    }
    assert all(v[0] == ".versions/tiny/v1" for v in links.values()), links  # the canary's model link restored
    if fault == "dies":
        assert "v2" in links[canary] and all("v2" not in v for h, v in links.items() if h != canary), links
    world.write()
    assert world.deploy().result == "nothing"


def test_concurrent_deploy_from_a_second_state_dir_is_refused(world: World) -> None:
    # The first deploy holds the lock while its canary (loading x1000 slower) waits out its gate.
    world.write(template={**TEMPLATE, "env": {"VLLM_SIM_TIME_SCALE": "1000"}})
    first: dict[str, DeployReport] = {}
    t = threading.Thread(target=lambda: first.update(rep=world.deploy(serial="1", gate_timeout_s=15, force=True)))
    t.start()
    try:
        deadline = time.monotonic() + 60
        while world.lab.run(world.lab.names[3], "test -e /var/lib/clusterctl/deploy.lock").returncode != 0:
            assert time.monotonic() < deadline and t.is_alive(), "the first deploy never took the lock"
            time.sleep(0.2)
        holder = json.loads(world.lab.run(world.lab.names[3], "cat /var/lib/clusterctl/deploy.lock", check=True).stdout)
        res = world.cli("deploy", "--json", state_dir=world.root / "second")
        assert res.returncode == 3, res.stdout + res.stderr
        assert f"held by {holder['holder']} (pid {holder['pid']}, run {holder['run_id']})" in res.stderr
        audit = (world.root / "second" / "audit.jsonl").read_text()
        assert '"result": "refused"' in audit
    finally:
        t.join(120)
    assert first["rep"].result == "rolled_back" and first["rep"].run_id == holder["run_id"]
    assert world.lab.run(world.lab.names[3], "test -e /var/lib/clusterctl/deploy.lock").returncode != 0  # released
    world.write()
    assert world.deploy().result == "nothing"


def test_secrets_stay_out_of_units_ps_journal_and_plan(world: World) -> None:
    world.write(
        e1=explicit(f"{world.lab.names[0]}:7", 8300, **{"max-num-seqs": 16}),
        e2=explicit(f"{world.lab.names[2]}:7", 8300),
    )
    plan = world.cli("deploy", "--plan")
    plan_json = world.cli("deploy", "--plan", "--json")
    assert plan.returncode == 0 and "e1: changed" in plan.stdout, plan.stdout + plan.stderr
    assert KEY not in plan.stdout + plan.stderr + plan_json.stdout + plan_json.stderr
    world.write()
    for host in world.lab.names:
        units = world.lab.run(host, "cat /etc/systemd/system/clusterctl-*.service", check=True).stdout
        ps = world.lab.run(host, "ps -eo args", check=True).stdout
        journal = world.lab.run(host, "journalctl --no-pager -o cat | tail -n 20000", timeout=60).stdout
        mode = world.lab.run(host, "stat -c '%a %U' /etc/clusterctl/instances/*.env", check=True).stdout
        assert KEY not in units and KEY not in ps and KEY not in journal, host
        assert set(mode.split("\n")) - {""} == {"600 root"}, mode
    audit = (world.state_dir / "audit.jsonl").read_text()
    assert KEY not in audit and '"kind": "deploy"' in audit


def test_release_prestaged_while_v1_serves_each_batch_only_switches(world: World) -> None:
    """The release case of ``--prestage`` on the shared deployment (v1 serving on all 8 replicas):
    the next version (v3) is verified and in the page cache of every host before the first v1
    unit stops; in 2 batches of 2 hosts, every replica on a host outside the current batch
    answers at every poll (v1 until its own batch, v3 after); each batch's staging only
    switches the model link, in its apply job (no staging run).

    Last in the module: it leaves v3 serving (the fixture removes everything after it)."""
    hosts = sorted(world.lab.names)
    before, placed = world.units(), world.placed()
    urls = {
        name: f"http://{world.lab.host(h).address}:{port}/v1/models"
        for h, units in placed.items()
        for name, (port, _, _) in units.items()
    }
    answers: list[tuple[float, str, bool]] = []  # (time.time(), instance, answered)
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            for name, url in urls.items():
                t = time.time()
                req = urllib.request.Request(url, headers={"Authorization": f"Bearer {KEY}"})
                try:
                    with urllib.request.urlopen(req, timeout=2) as r:
                        ok = r.status == 200 and b'"tiny"' in r.read()
                except (OSError, ValueError):
                    ok = False
                answers.append((t, name, ok))
            stop.wait(0.05)

    events: list[tuple[float, Event]] = []
    world.write(version="v3")  # not v2: the failing-canary test leaves a v2 staged on its canary
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    t0 = time.time()
    try:
        rep = world.deploy(serial="50%", prestage=True, on_event=lambda e: events.append((time.time(), e)))
    finally:
        stop.set()
        poller.join(10)
    assert rep.result == "ok", json.dumps(rep.to_dict(), indent=1)[:4000]
    assert [len(b) for b in rep.batches] == [2, 2], rep.batches
    assert rep.prestage is not None and rep.prestage["hosts"] == {h: {"tiny": "staged"} for h in hosts}
    assert rep.prestage["resident"] == {h: {"tiny": 1.0} for h in hosts}
    after, now = world.units(), world.placed("/models/.versions/tiny/v3/.clusterctl-verified")
    assert sorted(after) == sorted(before)
    for name, (state, _, started, restarts) in after.items():  # every replica restarted once
        assert state == "active" and restarts == 0 and started != before[name][2], (name, after[name])
    assert {n: v for units in now.values() for n, (_, v, _) in units.items()} == {n: "v3" for n in after}
    # v3 verified on every host before the first v1 unit stopped (one CLOCK_MONOTONIC: see above)
    offset = time.time() - time.monotonic()
    verified = {h: world.marker[h] for h in hosts}
    stopped = {n: at + offset for units in now.values() for n, (_, _, at) in units.items()}
    assert min(verified.values()) > t0 and max(verified.values()) < min(stopped.values()), (verified, stopped)
    # each batch only switched, in its apply (the node checked v3's marker): no staging run in a batch
    in_batches = [e for _, e in events if e.kind == "host" and e.message.startswith("stage tiny:")]
    assert in_batches == [], [e.message for e in in_batches]
    switched = [e for _, e in events if e.kind == "host" and e.message.startswith("switch tiny to v3 in the apply")]
    assert sorted(e.host or "" for e in switched) == hosts, [e.message for _, e in events if e.kind == "host"]
    # while a batch ran, every replica outside it answered at every poll, and one inside it did not
    starts = {e.step: t for t, e in events if e.kind == "batch" and e.step and not e.done}
    ends = {e.step: t for t, e in events if e.kind == "batch" and e.step and e.done}
    assert sorted(starts) == sorted(ends) == [1, 2], [e.message for _, e in events if e.kind == "batch"]
    for n, batch in enumerate(rep.batches, 1):
        inside = {name for h in batch for name in placed[h]}
        seen = [(t, name, ok) for t, name, ok in answers if starts[n] <= t <= ends[n]]
        assert {name for _, name, _ in seen} == set(after), (n, len(seen))
        assert all(ok for _, name, ok in seen if name not in inside), (
            n,
            [(round(t - t0, 2), name) for t, name, ok in seen if not ok and name not in inside],
        )
        assert any(not ok for _, name, ok in seen if name in inside), (n, sorted(inside))  # the poll sees a stop
