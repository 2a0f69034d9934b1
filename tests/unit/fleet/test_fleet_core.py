"""Fleet fan-out semantics, driven by the FakeTransport (no network)."""

from __future__ import annotations

import threading
import time

import pytest

from clusterctl.errors import FleetError
from clusterctl.fleet import Fleet, HostStatus
from clusterctl.fleet.transport import FakeReply, FakeTransport, HostFailure
from clusterctl.inventory.model import Host, SSHSettings


def hosts(n: int, user: str = "root") -> list[Host]:
    return [Host(f"gpu{i:02d}", f"10.0.0.{i}", ssh=SSHSettings(user=user)) for i in range(1, n + 1)]


def test_one_row_per_host_in_given_order_and_gathered():
    t = FakeTransport(lambda h, c, s: FakeReply(0, "6.1.0\n" if h.name != "gpu03" else "5.15.0\n"))
    with Fleet(hosts(8), transport=t) as f:
        res = f.run("uname -r")
    assert res.hosts == [f"gpu{i:02d}" for i in range(1, 9)]
    groups = res.gather()
    assert [(g.nodeset, g.stdout) for g in groups] == [("gpu[01-02,04-08]", "6.1.0\n"), ("gpu03", "5.15.0\n")]
    assert res.worst_rc() == 0 and res.failed_hosts() == []


def test_status_rows_and_worst_rc():
    def handler(h, c, s):
        return {
            "gpu01": FakeReply(0),
            "gpu02": FakeReply(3, "", "boom\n"),
            "gpu03": HostFailure(HostStatus.TIMEOUT, "command timed out after 1s"),
        }.get(h.name, FakeReply(0))

    def on_connect(h):
        if h.name == "gpu04":
            return HostFailure(HostStatus.UNREACHABLE, "connection refused")
        if h.name == "gpu05":
            return HostFailure(HostStatus.AUTH_FAILED, "server refused every key")
        return None

    with Fleet(hosts(5), transport=FakeTransport(handler, on_connect)) as f:
        res = f.run("x")
    st = {r.host: r.status for r in res}
    assert st == {
        "gpu01": HostStatus.OK,
        "gpu02": HostStatus.FAILED,
        "gpu03": HostStatus.TIMEOUT,
        "gpu04": HostStatus.UNREACHABLE,
        "gpu05": HostStatus.AUTH_FAILED,
    }
    assert res["gpu02"].rc == 3 and res["gpu02"].stderr == "boom\n"
    assert res["gpu04"].error == "connection refused"
    assert res.worst_rc() == 255
    assert res.failed_hosts() == ["gpu02", "gpu03", "gpu04", "gpu05"]


def test_worst_rc_is_largest_remote_rc_without_connect_failures():
    t = FakeTransport(lambda h, c, s: FakeReply(int(h.name[-1])))
    with Fleet(hosts(4), transport=t) as f:
        assert f.run("x").worst_rc() == 4


@pytest.mark.parametrize("fanout", [1, 3, 8])
def test_fanout_bound_never_exceeded(fanout):
    t = FakeTransport(lambda h, c, s: FakeReply(0, delay_s=0.01))
    # Threads other tests left behind (e.g. abandoned watchdog threads) are not ours.
    before = {th.ident for th in threading.enumerate()}
    with Fleet(hosts(30), fanout=fanout, transport=t) as f:
        res = f.run("x")
        assert res.all_ok()
        assert f.fanout == fanout
        # connections kept for reuse stay within the bound too
        assert t.open <= fanout
        ours = [th for th in threading.enumerate() if th.ident not in before]
        assert len(ours) <= fanout  # the fleet's workers, never more than the fan-out
    assert t.max_open == fanout
    assert t.open == 0  # all closed on exit


def test_connection_reused_across_runs_when_hosts_fit_in_fanout():
    t = FakeTransport()
    with Fleet(hosts(5), fanout=8, transport=t) as f:
        f.run("a")
        f.run("b")
        f.run({"gpu01": "c"})
    assert t.connects == {f"gpu{i:02d}": 1 for i in range(1, 6)}


def test_more_hosts_than_fanout_evicts_but_reuses_warm_hosts_first():
    t = FakeTransport()
    with Fleet(hosts(10), fanout=4, transport=t) as f:
        f.run("a")
        f.run("b")
        assert t.max_open <= 4
    # second run: the 4 hosts still connected were reused, 6 reconnected
    assert sum(t.connects.values()) == 10 + 6


def test_deadline_ends_run_with_timeout_rows():
    def handler(h, c, s):
        return FakeReply(0, delay_s=30 if h.name in ("gpu02", "gpu03") else 0)

    t = FakeTransport(handler)
    t0 = time.monotonic()
    with Fleet(hosts(4), fanout=4, deadline=0.5, transport=t) as f:
        res = f.run("x")
    assert time.monotonic() - t0 < 2
    assert res["gpu01"].ok and res["gpu04"].ok
    assert res["gpu02"].status is HostStatus.TIMEOUT
    assert "deadline" in (res["gpu02"].error or "")


def test_deadline_covers_hosts_that_never_started():
    t = FakeTransport(lambda h, c, s: FakeReply(0, delay_s=30))
    with Fleet(hosts(6), fanout=2, deadline=0.3, transport=t) as f:
        res = f.run("x")
    assert len(res) == 6
    assert {r.status for r in res} == {HostStatus.TIMEOUT}
    assert all("deadline" in (r.error or "") for r in res)
    # the queued hosts were never started (at most one may slip in at the boundary)
    assert sum("before this host started" in (r.error or "") for r in res) >= 3


def test_command_timeout_per_host():
    t = FakeTransport(lambda h, c, s: FakeReply(0, delay_s=5 if h.name == "gpu01" else 0))
    with Fleet(hosts(2), command_timeout=0.2, transport=t) as f:
        res = f.run("x")
    assert res["gpu01"].status is HostStatus.TIMEOUT and res["gpu02"].ok


def test_per_host_command_mapping_and_unknown_host():
    t = FakeTransport(lambda h, c, s: FakeReply(0, c))
    with Fleet(hosts(3), transport=t) as f:
        res = f.run({"gpu01": "one", "gpu03": "three"})
        assert [(r.host, r.stdout) for r in res] == [("gpu01", "one"), ("gpu03", "three")]
        with pytest.raises(FleetError, match="gpu09"):
            f.run({"gpu09": "x"})


def test_on_result_called_once_per_host():
    seen = []
    with Fleet(hosts(7), transport=FakeTransport()) as f:
        f.run("x", on_result=lambda r: seen.append(r.host))
    assert sorted(seen) == [f"gpu{i:02d}" for i in range(1, 8)]


def test_unexpected_exception_becomes_error_row():
    def handler(h, c, s):
        if h.name == "gpu02":
            raise RuntimeError("library bug")
        return FakeReply(0)

    with Fleet(hosts(2), transport=FakeTransport(handler)) as f:
        res = f.run("x")
    assert res["gpu02"].status is HostStatus.ERROR and "library bug" in res["gpu02"].error


def test_keyboard_interrupt_closes_connections():
    t = FakeTransport(lambda h, c, s: FakeReply(0, delay_s=30))
    f = Fleet(hosts(4), transport=t)

    def interrupt(r):
        raise KeyboardInterrupt

    def handler(h, c, s):
        return FakeReply(0) if h.name == "gpu01" else FakeReply(0, delay_s=30)

    t.handler = handler
    with pytest.raises(KeyboardInterrupt):
        f.run("x", on_result=interrupt)
    deadline = time.monotonic() + 2
    while t.open and time.monotonic() < deadline:
        time.sleep(0.01)
    assert t.open == 0


def test_duplicate_host_rejected():
    h = hosts(1)
    with pytest.raises(FleetError, match="gpu01"):
        Fleet(h + h, transport=FakeTransport())


def test_no_python_mapping():
    def handler(h, c, s):
        if h.name == "gpu01":
            return FakeReply(127, "", "clusterctl: python3 not found\n")
        return FakeReply(0, "hi\n")

    t = FakeTransport(handler)
    with Fleet(hosts(2), transport=t) as f:
        res = f.run_python(b"print('hi')", ["--x", "a b"])
    assert res["gpu01"].status is HostStatus.NO_PYTHON
    assert res["gpu01"].effective_rc == 127
    assert res["gpu02"].ok
    cmd = t.commands[0][1]
    assert "python3 - --x 'a b'" in cmd and t.commands[0][2] == b"print('hi')"


def test_sudo_password_only_on_stdin_and_redacted():
    secret = "s3cr3t-pw"
    t = FakeTransport(lambda h, c, s: FakeReply(1, f"echoed {secret}\n", f"err {secret}"))
    with Fleet(hosts(1, user="ops"), become_password=secret, transport=t) as f:
        res = f.run("id -u", sudo=True, stdin=b"data")
    name, cmd, stdin = t.commands[0]
    assert secret not in cmd
    assert stdin == secret.encode() + b"\ndata"
    r = res["gpu01"]
    assert secret not in r.stdout and secret not in r.stderr and secret not in repr(r)


def test_sudo_nopasswd_and_root_login():
    t = FakeTransport()
    with Fleet(hosts(1, user="ops"), transport=t) as f:
        f.run("id -u", sudo=True)
    assert t.commands[-1][1] == "sudo -n -- sh -c 'id -u'"
    t2 = FakeTransport()
    with Fleet(hosts(1, user="root"), become_password="pw", transport=t2) as f:
        f.run("id -u", sudo=True)
    assert t2.commands[-1][1:] == ("id -u", None)


def test_open_connections_bounded_while_handshakes_overlap_across_runs():
    import random

    rnd = random.Random(7)
    t = FakeTransport(lambda h, c, s: FakeReply(0, delay_s=rnd.random() / 200), on_connect=lambda h: rnd.random() / 100)
    with Fleet(hosts(40), fanout=5, transport=t) as f:
        for _ in range(3):
            assert f.run("x").all_ok()
            assert t.open <= 5
    assert t.max_open <= 5
    assert t.open == 0


def test_standard_error_streams_to_the_caller_with_its_host():
    t = FakeTransport(lambda h, c, s: FakeReply(0, "out\n", f"progress {h.name}\n"))
    seen: list[tuple[str, bytes]] = []
    lock = threading.Lock()

    def sink(host: str, chunk: bytes) -> None:
        with lock:
            seen.append((host, chunk))

    with Fleet(hosts(3), transport=t) as f:
        res = f.run("work", on_stderr=sink)
        assert sorted(seen) == [(f"gpu0{i}", f"progress gpu0{i}\n".encode()) for i in (1, 2, 3)]
        assert [r.stderr for r in res] == [f"progress gpu0{i}\n" for i in (1, 2, 3)]  # still in the rows
        seen.clear()
        f.run("work")
    assert seen == []


def test_a_connection_two_runs_share_is_not_evicted_when_one_of_them_ends():
    """Two runs on one fleet may use the same host at once (pre-flight's GPU facts beside its node
    reader); when the short one ends, the long one's connection must not become an eviction victim."""

    def handler(h, c, s):
        return FakeReply(0, "done\n", delay_s=1.5 if c == "slow" else 0.0)

    t = FakeTransport(handler)
    with Fleet(hosts(3), transport=t, fanout=2) as f:
        out: dict[str, object] = {}
        slow = threading.Thread(target=lambda: out.setdefault("slow", f.run({"gpu01": "slow"})))
        slow.start()
        deadline = time.monotonic() + 5
        while not any(c == "slow" for _, c, _ in t.commands) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert f.run({"gpu01": "fast"})["gpu01"].status is HostStatus.OK  # shares gpu01, ends first
        assert f.run({"gpu02": "x"})["gpu02"].status is HostStatus.OK
        assert f.run({"gpu03": "x"})["gpu03"].status is HostStatus.OK  # the pool is full: evicts one
        slow.join(5)
        res = out["slow"]
    assert res["gpu01"].status is HostStatus.OK, res["gpu01"].error  # type: ignore[index]
    assert res["gpu01"].stdout == "done\n"  # type: ignore[index]


def test_two_runs_connecting_to_one_host_at_once_leave_no_connection_open_after_close():
    t = FakeTransport(lambda h, c, s: FakeReply(0), on_connect=lambda h: 0.3)
    f = Fleet(hosts(2), transport=t, fanout=2)  # two workers: the runs' tasks on gpu01 run at once
    with f:
        results: list[object] = []
        runs = [threading.Thread(target=lambda: results.append(f.run({"gpu01": "x"}))) for _ in range(2)]
        for r in runs:
            r.start()
        for r in runs:
            r.join(5)
        assert [r["gpu01"].status for r in results] == [HostStatus.OK, HostStatus.OK]  # type: ignore[index]
        assert t.connects["gpu01"] == 2  # both connected before either was kept
        assert t.open == 1  # the second was closed at once; the fleet shares the first
    assert t.open == 0
