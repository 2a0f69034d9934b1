"""The fleet against real OpenSSH servers on 127.77.x.y (tier 2, root).

Each failure mode gives its own row and the run ends by its deadline:
nothing listening, a dropped SYN, a wrong key, a changed or unknown host key,
a hanging command, a port that never speaks SSH, a host without python3.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from clusterctl.fleet import Fleet, HostStatus
from clusterctl.fleet import shell
from clusterctl.fleet.ssh import ParamikoTransport
from clusterctl.lab.light import HostSpec, client_key
from support.sshd import SshdHarness, can_run

pytestmark = pytest.mark.skipif(can_run() is not None, reason=can_run() or "")

SUDO_USER = "clctl-sudo-test"


@pytest.fixture(scope="module")
def harness():
    h = SshdHarness(base="127.77")
    try:
        h.start(
            [
                HostSpec("ok1", "127.77.0.1"),
                HostSpec("ok2", "127.77.0.2"),
                # PATH without python3 for every session (sshd applies SetEnv last)
                HostSpec("nopy", "127.77.0.3", extra_config=["SetEnv PATH=/nonexistent-bin"]),
            ]
        )
        h.silent_server("127.77.9.1")
        h.blackhole("127.77.9.3")
        yield h
    finally:
        h.close()


def run(hosts, command="true", **kw):
    fleet_kw = {
        k: kw.pop(k)
        for k in ("fanout", "connect_timeout", "command_timeout", "deadline", "become_password", "transport")
        if k in kw
    }
    with Fleet(hosts, **fleet_kw) as f:
        return f.run(command, **kw)


def test_ok_hosts_run_and_gather(harness):
    res = run([harness.host("ok1"), harness.host("ok2")], "hostname; echo same")
    assert {r.host: r.stdout for r in res} == {"ok1": "ok1\nsame\n", "ok2": "ok2\nsame\n"}
    assert res.all_ok() and res.worst_rc() == 0


def test_every_failure_mode_has_its_own_row_within_the_deadline(harness, tmp_path):
    other_key, _ = client_key(tmp_path)  # a key the servers do not know
    hosts = [
        harness.host("ok1"),
        harness.host("refused", "127.77.9.2"),
        harness.host("blackhole", "127.77.9.3", connect_timeout=1),
        harness.host("silent", "127.77.9.1", connect_timeout=1),
        harness.host("wrongkey", "127.77.0.2", identity_file=str(other_key)),
    ]
    t0 = time.monotonic()
    res = run(hosts, "echo hi", deadline=8, transport=ParamikoTransport(use_agent=False))
    assert time.monotonic() - t0 < 8.5
    st = {r.host: (r.status, r.error) for r in res}
    assert st["ok1"][0] is HostStatus.OK
    assert st["refused"] == (HostStatus.UNREACHABLE, "connection refused")
    assert st["blackhole"][0] is HostStatus.UNREACHABLE and "TCP connect timed out" in st["blackhole"][1]
    assert st["silent"][0] is HostStatus.TIMEOUT and "no SSH banner" in st["silent"][1], st["silent"]
    assert st["wrongkey"][0] is HostStatus.AUTH_FAILED and "refused every key" in st["wrongkey"][1]
    assert res.worst_rc() == 255


def test_changed_host_key_refused_and_known_hosts_untouched(harness, tmp_path):
    kh = tmp_path / "known_hosts"
    wrong = harness.host_keys["ok2"]  # ok2's key recorded for ok1's address
    kh.write_text(f"# pinned\n127.77.0.1 {wrong}\n")
    before = kh.read_bytes()
    for policy in ("accept-new", "strict", "off"):
        res = run([harness.host("ok1", known_hosts=str(kh), host_key_policy=policy)])
        r = res["ok1"]
        assert r.status is HostStatus.HOSTKEY_MISMATCH, policy
        assert f"{kh}:2" in r.error and "remove line 2" in r.error
    assert kh.read_bytes() == before


def test_accept_new_records_key_then_strict_accepts(harness, tmp_path):
    kh = tmp_path / "sub" / "known_hosts"
    res = run([harness.host("ok1", known_hosts=str(kh), host_key_policy="accept-new")])
    assert res["ok1"].ok
    assert kh.read_text() == f"127.77.0.1 {harness.host_keys['ok1']}\n"
    res = run([harness.host("ok1", known_hosts=str(kh), host_key_policy="strict")])
    assert res["ok1"].ok


def test_strict_refuses_unknown_host(harness, tmp_path):
    kh = tmp_path / "known_hosts"
    res = run([harness.host("ok1", known_hosts=str(kh), host_key_policy="strict")])
    assert res["ok1"].status is HostStatus.HOSTKEY_MISMATCH
    assert "strict" in res["ok1"].error
    assert not kh.exists()


def test_off_policy_accepts_and_warns(harness, tmp_path):
    kh = tmp_path / "known_hosts"
    t = ParamikoTransport(host_key_policy="off")
    with Fleet([harness.host("ok1", known_hosts=str(kh))], transport=t) as f:
        assert f.run("true")["ok1"].ok
        assert any("OFF" in w for w in f.warnings)
    assert not kh.exists()


def test_hanging_command_times_out_and_run_ends_by_deadline(harness):
    t0 = time.monotonic()
    res = run(
        [harness.host("ok1"), harness.host("ok2")],
        {"ok1": "sleep 60", "ok2": "echo fast"},
        command_timeout=30,
        deadline=2,
    )
    assert time.monotonic() - t0 < 3
    assert res["ok1"].status is HostStatus.TIMEOUT and "deadline" in res["ok1"].error
    assert res["ok2"].ok
    res = run([harness.host("ok1")], "sleep 60", command_timeout=1)
    assert res["ok1"].status is HostStatus.TIMEOUT and "timed out after 1s" in res["ok1"].error


def test_host_without_python3(harness):
    hosts = [harness.host("nopy"), harness.host("ok1")]
    with Fleet(hosts) as f:
        res = f.run_python(b"import sys; print(sys.version_info[0])")
        assert res["nopy"].status is HostStatus.NO_PYTHON
        assert res["ok1"].ok and res["ok1"].stdout == "3\n"
        plain = f.run("python3 -c pass")  # without the check: an ordinary failure
        assert plain["nopy"].status is HostStatus.FAILED and plain["nopy"].rc == 127


def test_connection_reused_across_runs(harness):
    before = harness.log("ok2").count("Accepted publickey")
    with Fleet([harness.host("ok2")]) as f:
        for _ in range(3):
            assert f.run("true")["ok2"].ok
    assert harness.log("ok2").count("Accepted publickey") == before + 1


HOSTILE = [
    "; touch {m}",
    "$(touch {m})",
    "`touch {m}`",
    "a'b\"c; touch {m}",
    "x\ntouch {m}",
    "${{IFS}}touch${{IFS}}{m}",
    "&& touch {m} #",
]


def test_hostile_inventory_values_are_not_executed(harness, tmp_path):
    marker = tmp_path / f"pwned-{uuid.uuid4().hex}"  # the lab hosts share this filesystem
    values = [v.format(m=marker) for v in HOSTILE]
    host = harness.host("ok1")
    host.vars = {f"v{i}": v for i, v in enumerate(values)}
    host.labels = {"rack": f"r1; touch {marker}"}
    cmd = (
        shell.join(["printf", "%s\\0"] + list(host.vars.values()))
        + "; "
        + shell.with_env("printenv RACK", {"RACK": host.labels["rack"]})
    )
    res = run([host], cmd)
    r = res["ok1"]
    assert r.ok, r
    out, _, rack = r.stdout.rpartition("\0")
    assert out.split("\0") == values
    assert rack == f"r1; touch {marker}\n"
    assert not marker.exists()


def test_proxy_jump_through_bastion(harness):
    before = harness.log("ok1").count("Accepted publickey")
    target = harness.host("ok2", proxy_jump="root@127.77.0.1:22")
    second = harness.host("nopy", proxy_jump="root@127.77.0.1")
    res = run([target, second], "read h </proc/sys/kernel/hostname; echo $h")  # nopy: no PATH
    assert res["ok2"].stdout == "ok2\n" and res["nopy"].stdout == "nopy\n"
    # both hosts went through one bastion connection (pool of up to 4, created on demand)
    assert 1 <= harness.log("ok1").count("Accepted publickey") - before <= 2
    bad = harness.host("ok2", proxy_jump="root@127.77.9.2")
    assert run([bad])["ok2"].status is HostStatus.UNREACHABLE


# -- sudo with a password ----------------------------------------------------


@pytest.fixture(scope="module")
def sudo_user(harness):
    """A real non-root user whose sudo needs a password; removed afterwards."""
    password = "pw-" + uuid.uuid4().hex
    home = harness.dir / "sudo-home"
    home.mkdir()
    _remove_user()  # a leftover of an interrupted run
    subprocess.run(
        ["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/sh", SUDO_USER], check=True
    )
    try:
        subprocess.run(["chpasswd"], input=f"{SUDO_USER}:{password}\n", text=True, check=True)
        sudoers = Path(f"/etc/sudoers.d/{SUDO_USER}")
        sudoers.write_text(f"{SUDO_USER} ALL=(ALL) ALL\nDefaults:{SUDO_USER} !lecture\n")
        os.chmod(sudoers, 0o440)
        pub = (harness.dir / "keys" / "id_ed25519.pub").read_text()
        for name in ("ok1", "ok2"):
            (harness.dir / "hosts" / name / "authorized_keys" / SUDO_USER).write_text(pub)
        yield password
    finally:
        Path(f"/etc/sudoers.d/{SUDO_USER}").unlink(missing_ok=True)
        _remove_user()


def _remove_user() -> None:
    """userdel refuses while a session of the user is still ending: retry, then force."""
    for _ in range(20):
        try:
            pwd.getpwnam(SUDO_USER)
        except KeyError:
            return
        if subprocess.run(["userdel", SUDO_USER], capture_output=True).returncode == 0:
            return
        time.sleep(0.25)
    subprocess.run(["userdel", "-f", SUDO_USER], check=True)


def _cmdlines() -> str:
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                out.append((p / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace"))
                out.append((p / "environ").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace"))
            except OSError:
                pass
    return "\n".join(out)


def test_sudo_with_password_runs_as_root_and_never_leaks(harness, sudo_user):
    password = sudo_user
    hosts = [harness.host("ok1", user=SUDO_USER), harness.host("ok2", user=SUDO_USER)]
    seen: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(_cmdlines())
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with Fleet(hosts, become_password=password) as f:
            res = f.run("id -u; whoami; sleep 1; cat", sudo=True, stdin=b"from-stdin\n")
            plain = f.run("id -u")
    finally:
        stop.set()
        watcher.join()
    for r in res:
        assert r.ok, r
        assert r.stdout == "0\nroot\nfrom-stdin\n"
    assert all(r.stdout == f"{pwd.getpwnam(SUDO_USER).pw_uid}\n" for r in plain)
    assert len(seen) >= 5
    assert not any(password in s for s in seen)
    for r in list(res) + list(plain):
        assert password not in repr(r)
    for name in ("ok1", "ok2"):
        assert password not in harness.log(name)


def test_sudo_wrong_password_fails_cleanly(harness, sudo_user):
    with Fleet([harness.host("ok1", user=SUDO_USER)], become_password="not-the-password") as f:
        r = f.run("id -u", sudo=True)["ok1"]
    assert r.status is HostStatus.FAILED and r.rc == 1
    assert "not accepted" in r.stderr and "not-the-password" not in r.stderr + r.stdout


def test_sudo_without_password_fails_fast_when_one_is_needed(harness, sudo_user):
    with Fleet([harness.host("ok1", user=SUDO_USER)], command_timeout=10) as f:
        r = f.run("id -u", sudo=True)["ok1"]
    assert r.status is HostStatus.FAILED and "password is required" in r.stderr


def test_ctrl_c_aborts_connects_in_progress(harness):
    """Ctrl-C while a connect hangs: the run stops and no worker lingers for the timeout."""
    hosts = [harness.host("ok1"), harness.host("blackhole", "127.77.9.3", connect_timeout=30)]
    f = Fleet(hosts, fanout=2)

    def interrupt(r):
        raise KeyboardInterrupt

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        f.run("true", on_result=interrupt)  # ok1 answers first, then "Ctrl-C"
    workers = [t for t in threading.enumerate() if t.name.startswith("fleet")]
    for t in workers:
        t.join(timeout=5)
    assert not any(t.is_alive() for t in workers)
    assert time.monotonic() - t0 < 5


def test_large_stdin_is_read_whole_or_left_unread_without_error(harness):
    big = os.urandom(8 << 20)
    hosts = [harness.host("ok1"), harness.host("ok2")]
    whole = run(hosts, "wc -c; echo progress >&2", stdin=big)
    assert all(r.ok and r.stdout.strip() == str(len(big)) for r in whole), list(whole)
    # A command that exits without reading all its input (as a relay child does) is still a
    # success, like ssh(1): no "Socket is closed" row.
    early = run(hosts, "head -c 10 >/dev/null; echo done", stdin=big, command_timeout=30)
    assert all(r.ok and r.stdout == "done\n" for r in early), list(early)
