"""The node cache of shipped programs (clusterctl.fleet.cached) through the real Fleet,
with a transport that runs each command in a local shell: the real loader runs with this
machine's python3 and caches in a temporary directory."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
import threading
import time

import pytest

from clusterctl.fleet import Fleet
from clusterctl.errors import FleetError
from clusterctl.fleet.cached import KEEP, RC_DAMAGED, digest, loader_command, run_cached
from clusterctl.fleet.transport import FakeReply, FakeTransport
from clusterctl.inventory.model import Host

PROGRAM = b"import sys\nprint('args', ' '.join(sys.argv[1:]), sys.argv[0])\n"


def local_shell(host, command, stdin):
    p = subprocess.run(["/bin/sh", "-c", command], input=stdin, capture_output=True, timeout=60)
    return FakeReply(p.returncode, p.stdout, p.stderr)


@pytest.fixture
def node(tmp_path, monkeypatch):
    cache = tmp_path / "home" / ".cache" / "programs"
    monkeypatch.setenv("CLUSTERCTL_NODE_CACHE_DIR", str(cache))
    monkeypatch.delenv("CLUSTERCTL_NODE_CACHE", raising=False)
    transport = FakeTransport(local_shell)
    fleet = Fleet([Host(name=n, address="127.0.0.1") for n in ("a", "b")], transport=transport)
    yield fleet, transport, cache
    fleet.close()


def shipped(transport) -> list[tuple[str, int]]:
    """(host, bytes on stdin) per command, in order."""
    out = [(h, len(s or b"")) for h, _, s in transport.commands]
    transport.commands.clear()
    return out


def test_shipped_once_then_run_from_the_verified_copy(node):
    fleet, transport, cache = node
    seen = []
    rows = run_cached(fleet, PROGRAM, {"a": ["x", "y z"], "b": []}, on_result=lambda r: seen.append(r.host))
    assert [(r.host, r.rc, r.stdout) for r in rows] == [("a", 0, "args x y z -\n"), ("b", 0, "args  -\n")]
    assert sorted(seen) == ["a", "b"]  # each host reported once, after its real run
    assert sorted(shipped(transport)) == [("a", 0), ("a", len(PROGRAM)), ("b", 0), ("b", len(PROGRAM))]
    f = cache / (digest(PROGRAM) + ".py")
    assert f.read_bytes() == PROGRAM
    assert stat.S_IMODE(f.stat().st_mode) == 0o600 and stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert [n for n in os.listdir(cache) if n != f.name] == []  # no temporary file left behind
    rows = run_cached(fleet, PROGRAM, ["again"])
    assert [r.stdout for r in rows] == ["args again -\n"] * 2
    assert sorted(shipped(transport)) == [("a", 0), ("b", 0)]  # one round trip, nothing shipped


def test_a_changed_copy_is_never_run_and_is_replaced(node):
    fleet, transport, cache = node
    run_cached(fleet, PROGRAM)
    shipped(transport)
    f = cache / (digest(PROGRAM) + ".py")
    f.write_bytes(PROGRAM + b"print('tampered')\n")
    rows = run_cached(fleet, PROGRAM, ["1"])
    assert all("tampered" not in r.stdout and r.stdout == "args 1 -\n" for r in rows)
    assert sorted(shipped(transport)) == [("a", 0), ("a", len(PROGRAM)), ("b", 0), ("b", len(PROGRAM))]
    assert f.read_bytes() == PROGRAM


def test_a_new_program_is_shipped_and_old_ones_are_pruned(node):
    fleet, transport, cache = node
    versions = [PROGRAM + b"# v%d\n" % i for i in range(KEEP + 2)]
    for v in versions:
        run_cached(fleet, v)
    assert sorted(os.listdir(cache)) == sorted(digest(v) + ".py" for v in versions[-KEEP:])


def test_a_directory_others_can_write_is_not_used(node):
    fleet, transport, cache = node
    cache.mkdir(parents=True, mode=0o700)
    os.chmod(cache, 0o777)
    assert [r.stdout for r in run_cached(fleet, PROGRAM)] == ["args  -\n"] * 2  # still runs, from memory
    assert os.listdir(cache) == []
    shipped(transport)
    run_cached(fleet, PROGRAM)
    assert sorted(shipped(transport)) == [("a", 0), ("a", len(PROGRAM)), ("b", 0), ("b", len(PROGRAM))]


def test_a_program_damaged_on_the_way_is_refused(node, tmp_path):
    fleet, transport, cache = node
    p = subprocess.run(
        ["/bin/sh", "-c", loader_command(digest(PROGRAM), "store")],
        input=PROGRAM + b"#",
        capture_output=True,
        env=dict(os.environ),
    )
    assert p.returncode == RC_DAMAGED and b"sha256 mismatch" in p.stderr and p.stdout == b""
    assert not cache.exists() or os.listdir(cache) == []


def test_cache_off_ships_every_time(node, monkeypatch):
    fleet, transport, cache = node
    monkeypatch.setenv("CLUSTERCTL_NODE_CACHE", "off")
    for _ in range(2):
        assert [r.stdout for r in run_cached(fleet, PROGRAM, ["q"])] == ["args q -\n"] * 2
        assert sorted(shipped(transport)) == [("a", len(PROGRAM)), ("b", len(PROGRAM))]
    assert not cache.exists()


JOB_READER = (
    b"import sys\nprint('job', sys.stdin.buffer.readline().decode().strip(), 'then', sys.stdin.buffer.read())\n"
)


def test_a_job_on_stdin_follows_the_program_and_only_the_job_reaches_it(node, monkeypatch):
    """deploy's, the gateway's and staging's programs read a job on stdin: a host without the
    program gets the program and the job in one stream (the loader reads exactly the program),
    a host with it gets the job alone; with the cache off the program travels every time."""
    fleet, transport, cache = node
    job = b'{"op": "x"}\n\x00frame bytes'
    for round_trips in ([("a", 0), ("a", len(JOB_READER)), ("b", 0), ("b", len(JOB_READER))], [("a", 0), ("b", 0)]):
        rows = run_cached(fleet, JOB_READER, ["arg"], stdin=job)
        assert [r.stdout for r in rows] == ["job {\"op\": \"x\"} then b'\\x00frame bytes'\n"] * 2
        assert sorted((h, n - len(job)) for h, n in shipped(transport)) == round_trips
    assert (cache / (digest(JOB_READER) + ".py")).read_bytes() == JOB_READER
    monkeypatch.setenv("CLUSTERCTL_NODE_CACHE", "off")
    other = JOB_READER + b"# another version\n"
    rows = run_cached(fleet, other, ["arg"], stdin=job)
    assert [r.stdout for r in rows] == ["job {\"op\": \"x\"} then b'\\x00frame bytes'\n"] * 2
    assert sorted(shipped(transport)) == [("a", len(other) + len(job)), ("b", len(other) + len(job))]
    assert not (cache / (digest(other) + ".py")).exists()  # verified and run, not stored


SLEEPER = b"import sys, time\ntime.sleep(float(sys.argv[1]))\nprint('slept', sys.argv[1])\n"


def test_a_host_without_the_program_runs_beside_a_slow_cached_host(tmp_path, monkeypatch):
    """A host whose cache lacks the program starts its second round trip (program on stdin) as
    soon as its first one returned, not after a cached host that still runs has ended: the hosts
    of one run work at the same time (staging's relay serves the next host while it runs).  Its
    row is reported when it ends, in the caller's thread."""
    monkeypatch.delenv("CLUSTERCTL_NODE_CACHE", raising=False)
    t0 = time.monotonic()
    trips: list[tuple[str, str, float, float]] = []  # host, loader mode, start, end (s from t0)

    def per_host_cache(host, command, stdin):  # each host has a node cache of its own
        start = time.monotonic() - t0
        env = dict(os.environ, CLUSTERCTL_NODE_CACHE_DIR=str(tmp_path / host.name))
        p = subprocess.run(["/bin/sh", "-c", command], input=stdin, capture_output=True, timeout=60, env=env)
        trips.append((host.name, shlex.split(command)[6].partition("=")[0], start, time.monotonic() - t0))
        return FakeReply(p.returncode, p.stdout, p.stderr)

    hosts = [Host(name=n, address="127.0.0.1") for n in ("a", "b")]
    with Fleet(hosts, transport=FakeTransport(per_host_cache)) as fleet:
        assert [r.stdout for r in run_cached(fleet, SLEEPER, {"a": ["0"]})] == ["slept 0\n"]  # a has it, b not
        trips.clear()
        reported: list[tuple[str, float, bool]] = []
        main = threading.current_thread()
        rows = run_cached(
            fleet,
            SLEEPER,
            {"a": ["3"], "b": ["0"]},
            on_result=lambda r: reported.append((r.host, time.monotonic() - t0, threading.current_thread() is main)),
        )
    assert [(r.host, r.rc, r.stdout) for r in rows] == [("a", 0, "slept 3\n"), ("b", 0, "slept 0\n")]
    trip = {(h, mode): (start, end) for h, mode, start, end in trips}
    assert set(trip) == {("a", "run"), ("b", "run"), ("b", "store")}, trips
    a_end = trip["a", "run"][1]
    assert trip["b", "store"][0] < a_end, trips  # started while a still ran, not after it
    assert [h for h, _, _ in reported] == ["b", "a"] and all(mine for _, _, mine in reported), reported
    assert reported[0][1] < a_end, (reported, trips)  # b reported when it ended, not when a did


def test_an_error_in_a_round_trip_or_in_on_result_reaches_the_caller(node):
    """The round trips run in threads: what fails there (a closed fleet) or in the caller's
    ``on_result`` is raised in the caller's thread, and the fleet is closed, as fleet.run does."""
    fleet, transport, cache = node

    def boom(row):
        raise RuntimeError(f"on_result failed for {row.host}")

    with pytest.raises(RuntimeError, match="on_result failed for"):
        run_cached(fleet, PROGRAM, ["x"], on_result=boom)
    with pytest.raises(FleetError, match="closed"):
        run_cached(fleet, PROGRAM, ["x"])
