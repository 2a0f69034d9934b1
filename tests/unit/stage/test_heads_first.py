"""A relay chain's heads start first: the other hosts' sessions start once every head's node
program runs (it says so on stderr), so the source transfer overlaps their SSH and start-up."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from clusterctl.fleet import Fleet
from clusterctl.fleet.transport import FakeReply, FakeTransport
from clusterctl.inventory.model import Host, Model
from clusterctl.stage import bundle
from clusterctl.stage import run as sr
from clusterctl.stage.plan import Source
from unit.stage.nodehelp import make_model, manifest_for, stage_job

MARK = sr.STARTED_MARK.decode()


def hosts(n: int) -> list[Host]:
    return [Host(name=f"h{i}", address=f"10.0.0.{i}") for i in range(1, n + 1)]


def per_host(command: str) -> dict[str, Any]:
    """The per-host JSON argument of a node command (the last word, shell-quoted)."""
    import shlex

    return dict(json.loads(shlex.split(command)[-1]))


class Recorder:
    """Answers every staging job with ok; ``head_delay`` seconds for the head, which writes the
    started mark only when ``announce`` (then FakeTransport delivers it after the delay)."""

    def __init__(self, head_delay: float, announce: bool = True):
        self.head_delay, self.announce = head_delay, announce
        self.t0 = time.monotonic()
        self.calls: dict[str, tuple[float, dict[str, Any]]] = {}
        self.lock = threading.Lock()

    def __call__(self, host: Host, command: str, stdin: bytes | None) -> FakeReply:
        args = per_host(command)
        with self.lock:
            self.calls[host.name] = (time.monotonic() - self.t0, args)
        out = json.dumps({"ok": True, "version": "v1"}) + "\n"
        if host.name == "h1":
            err = MARK + "\n" if self.announce and args.get("announce") else ""
            return FakeReply(0, out, err, delay_s=self.head_delay)
        return FakeReply(0, out)


def stage(tmp_path: Path, rec: Recorder, n: int, relay: str = "chain") -> Any:
    src = make_model(tmp_path / "src", {"a.bin": 5000})
    man = manifest_for(src)
    hs = hosts(n)
    with Fleet(hs, fanout=n, transport=FakeTransport(rec)) as fleet:
        return sr.stage_model(fleet, hs, Model("m", "/models/m"), Source("http", "http://src/m/"), man, relay=relay)


def test_the_other_hosts_start_only_after_the_head_said_it_runs(tmp_path: Path) -> None:
    rec = Recorder(head_delay=0.4)
    rep = stage(tmp_path, rec, 4)
    assert [r.host for r in rep.rows] == ["h1", "h2", "h3", "h4"] and rep.ok
    assert rec.calls["h1"][1].get("announce") is True
    assert not any(rec.calls[h][1].get("announce") for h in ("h2", "h3", "h4"))
    head = rec.calls["h1"][0]
    assert min(rec.calls[h][0] for h in ("h2", "h3", "h4")) - head >= 0.4  # after the mark arrived


def test_a_head_that_never_says_so_holds_the_others_back_only_so_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sr, "HEADS_START_WAIT_S", 0.3)
    rec = Recorder(head_delay=3.0, announce=False)
    rep = stage(tmp_path, rec, 3)
    assert rep.ok and len(rep.rows) == 3
    waited = min(rec.calls[h][0] for h in ("h2", "h3")) - rec.calls["h1"][0]
    assert 0.25 <= waited < 2.5  # not the head's 3 s


def test_every_host_reads_the_source_at_once_without_a_relay(tmp_path: Path) -> None:
    rec = Recorder(head_delay=0.4)
    rep = stage(tmp_path, rec, 3, relay="none")
    assert rep.ok and not any(args.get("announce") for _, args in rec.calls.values())
    starts = [t for t, _ in rec.calls.values()]
    assert max(starts) - min(starts) < 0.4  # nobody waited for the 0.4 s "head"


def test_the_node_program_says_it_runs_before_it_stages(tmp_path: Path) -> None:
    src = make_model(tmp_path / "src", {"a.bin": 5000})
    man = manifest_for(src)
    job = stage_job(man, tmp_path / "models" / "m", {"kind": "file", "root": str(src)})
    proc = subprocess.run(
        [sys.executable, "-I", "-B", "-c", bundle.bootstrap(), json.dumps({"announce": True})],
        input=json.dumps(job).encode() + b"\n",
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.decode().splitlines()[0] == MARK
    assert json.loads(proc.stdout.decode().strip().splitlines()[-1])["ok"]


class Uncached(Recorder):
    """h3 and h4 have no copy of the staging program in their node cache: a cached run's first
    round trip (the loader's ``run``) ends at once with RC_NOT_CACHED there."""

    def __init__(self, head_delay: float):
        super().__init__(head_delay)
        self.stored: set[str] = set()  # hosts that got the program with their job

    def __call__(self, host: Host, command: str, stdin: bytes | None) -> FakeReply:
        import re

        from clusterctl.fleet.cached import RC_NOT_CACHED

        if host.name in ("h3", "h4") and re.search(r" [0-9a-f]{64} run ", command):  # the loader's cached run
            return FakeReply(RC_NOT_CACHED, "", "")
        if re.search(r" [0-9a-f]{64} store=[0-9]+ ", command):  # the second round trip: program + job
            with self.lock:
                self.stored.add(host.name)
        reply = super().__call__(host, command, stdin)
        if host.name == "h2":  # a cached host relays for a while too
            reply = FakeReply(0, reply.stdout, "", delay_s=1.0)
        return reply


def test_hosts_without_the_program_start_while_the_head_still_relays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every host of a chain runs its relay at the same time, whether or not its node cache had
    the program: a host that lacked it must not start only after the others ended (its parent
    would have stopped listening).  The relay goes through the node cache (h3 and h4 got the
    program with their job in a second round trip, started as soon as their first one returned)."""
    monkeypatch.delenv("CLUSTERCTL_NODE_CACHE", raising=False)
    rec = Uncached(head_delay=1.0)
    rep = stage(tmp_path, rec, 4)
    assert rep.ok, rep.rows
    assert rec.stored == {"h3", "h4"}
    started = {h: c[0] for h, c in rec.calls.items()}
    assert all(started[h] - started["h2"] < 0.5 for h in ("h3", "h4")), started
