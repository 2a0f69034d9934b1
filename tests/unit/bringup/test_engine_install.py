"""``clusterctl engine install`` / ``remove``: the node scripts run by ``sh`` against a temp tree with a tiny
vLLM stand-in wheel built here (a real ``python3 -m venv`` + ``pip install --no-index``), a killed install,
the refusals, and the run over a Fleet whose FakeTransport executes the commands locally (one real
install for the whole module)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from clusterctl.bringup import engine_install as ei
from clusterctl.bringup import engines as eng
from clusterctl.errors import ClusterctlError
from clusterctl.fleet.fleet import Fleet
from clusterctl.fleet.transport import FakeReply, FakeTransport
from clusterctl.inventory.model import Engine, Host, Inventory, SSHSettings
from support.wheels import build_wheel


def _sh(script: str, stdin: bytes | None = None, timeout: float = 300) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["sh", "-c", script], input=stdin, capture_output=True, timeout=timeout)


def _read(e: Engine, units: Path) -> eng.EngineRow:
    out = _sh(eng.read_command([e], str(units))).stdout.decode()
    return eng.parse_read("h", [e], out)[0]


def test_a_wheelhouse_without_the_inventorys_version_is_refused_here(tmp_path: Path) -> None:
    wheels = tmp_path / "w"
    build_wheel(wheels, "0.11.0")
    with pytest.raises(ClusterctlError, match="no vllm wheel of version 0.12.0"):
        ei.wheelhouse(str(wheels), "0.12.0")
    with pytest.raises(ClusterctlError, match="not a directory"):
        ei.wheelhouse(str(tmp_path / "nope"), "0.11.0")
    assert ei.wheelhouse(str(wheels), "0.11")  # 0.11 is release 0.11.0, as pip reads it


def test_a_failed_install_leaves_neither_the_path_nor_its_temp_dir(tmp_path: Path) -> None:
    fake = tmp_path / "fakebin"
    fake.mkdir()
    # a python3 whose venv breaks half-way (bin/ created, then an error), with and without pip
    (fake / "python3").write_text('#!/bin/sh\nfor a; do d=$a; done; mkdir -p "$d/bin"; echo "Error" >&2; exit 1\n')
    (fake / "python3").chmod(0o755)
    e = Engine("vllm-0.12", f"{tmp_path}/opt/vllm-0.12.0/bin/vllm", "0.12.0")
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    r = subprocess.run(
        ["sh", "-c", ei.install_script(e, "wheels")], input=b"", capture_output=True, timeout=30, env=env
    )
    assert r.returncode == 1 and b"failed: python3 -m venv\n" in r.stderr
    assert list((tmp_path / "opt").iterdir()) == []
    # no ensurepip (venv without pip works) and no pip wheel in the wheelhouse to bootstrap pip from
    (fake / "python3").write_text(
        '#!/bin/sh\nfor a; do d=$a; done; mkdir -p "$d/bin"\n'
        '[ "$3" = --without-pip ] || { echo "no ensurepip" >&2; exit 1; }\n'
    )
    wheels = tmp_path / "w"
    build_wheel(wheels, "0.12.0")
    r = subprocess.run(
        ["sh", "-c", ei.install_script(e, "wheels")],
        input=ei.wheelhouse(str(wheels), "0.12.0"),
        capture_output=True,
        timeout=30,
        env=env,
    )
    assert r.returncode == 1 and b"has no ensurepip here" in r.stderr
    assert list((tmp_path / "opt").iterdir()) == []


def test_a_remove_refuses_a_path_that_is_not_a_virtualenv(tmp_path: Path) -> None:
    root = tmp_path / "opt/vllm-sim"
    (root / "bin").mkdir(parents=True)
    (root / "bin/vllm").write_text("#!/bin/sh\n")
    r = _sh(ei.remove_script(Engine("sim", f"{root}/bin/vllm", "0.11.0"), str(tmp_path)))
    assert r.returncode == 1 and b"not a virtualenv" in r.stderr and root.exists()


@pytest.mark.parametrize(
    "path",
    [
        "/usr/bin/vllm",
        "/opt/vllm",
        "/opt/v llm/bin/vllm",
        "/opt/x/../bin/vllm",
        "relative/bin/vllm",
        "/opt/vllm-0.11/vllm",
    ],
)
def test_paths_install_cannot_own_are_refused(path: str) -> None:
    with pytest.raises(ClusterctlError, match="is not ROOT/bin/EXECUTABLE"):
        ei.check_engine(Engine("e", path, "0.11.0"))
    with pytest.raises(ClusterctlError, match="not a release"):
        ei.check_engine(Engine("e", "/opt/vllm-0.11/bin/vllm", "0.11; rm -rf /"))


def test_plans_from_what_engine_list_reads() -> None:
    row = eng.EngineRow("h", "e", "/opt/e/bin/vllm", "0.11.0", "installed", version="0.11.0")
    assert ei.install_plan(row).changes == [] and ei.install_plan(row).error is None
    missing = eng.EngineRow("h", "e", "/opt/e/bin/vllm", "0.11.0", "missing")
    assert [c.line() for c in ei.install_plan(missing).changes] == [
        "e /opt/e/bin/vllm: missing -> installed (vllm 0.11.0)"
    ]
    other = eng.EngineRow("h", "e", "/opt/e/bin/vllm", "0.11.0", "installed", version="0.10.2")
    assert "not touched" in (ei.install_plan(other).error or "")
    sim = eng.EngineRow("h", "e", "/opt/e/bin/vllm", "0.11.0", "installed")  # no recorded version
    assert "version not recorded" in (ei.install_plan(sim).error or "")
    unread = eng.EngineRow("h", "e", "/opt/e/bin/vllm", "0.11.0", "unread", error="timeout")
    assert ei.install_plan(unread).error == "timeout" and ei.remove_plan(unread).error == "timeout"
    assert ei.remove_plan(missing).changes == [] and ei.remove_plan(missing).error is None
    assert [c.wanted for c in ei.remove_plan(row).changes] == ["removed"]


def _inv(e: Engine, hosts: list[Host]) -> Inventory:
    return Inventory(path="inv.yaml", hosts={h.name: h for h in hosts}, engines={e.name: e})


def test_a_run_over_a_fleet_installs_only_where_missing_and_reads_again(tmp_path: Path) -> None:
    wheels = tmp_path / "wheelhouse"
    build_wheel(wheels)
    units = tmp_path / "units"
    units.mkdir()
    e = Engine("vllm-0.11", f"{tmp_path}/opt/vllm-0.11.0/bin/vllm", "0.11.0")
    hosts = [
        Host("gpu01", "10.0.0.1", ssh=SSHSettings(user="root")),
        Host("gpu02", "10.0.0.2", ssh=SSHSettings(user="root")),
    ]

    def handler(host: Host, command: str, stdin: bytes | None) -> FakeReply:
        if host.name == "gpu02":  # already has it: answers the read only
            assert "engine install" not in command
            return FakeReply(0, f"engine {e.path} installed\ndist {e.path} vllm-0.11.0.dist-info\n")
        r = subprocess.run(["sh", "-c", command], input=stdin, capture_output=True, timeout=300)
        return FakeReply(r.returncode, r.stdout, r.stderr)

    transport = FakeTransport(handler)
    events: list[tuple[str, str | None]] = []
    op = ei.EngineOp(
        _inv(e, hosts),
        e.name,
        hosts,
        lambda hs: Fleet(list(hs), transport=transport),
        wheels=str(wheels),
        sudo=False,
        units_dir=str(units),
        on_event=lambda k, m, h: events.append((m, h)),
    )
    plans = op.plan()
    assert [(p.host, len(p.changes), p.error) for p in plans] == [("gpu01", 1, None), ("gpu02", 0, None)]
    rep = op.run(plans)
    assert rep.ok and [(o.host, o.status) for o in rep.outcomes] == [("gpu01", "changed"), ("gpu02", "unchanged")]
    installs = [(h, s) for h, c, s in transport.commands if "engine install" in c]
    assert [h for h, _ in installs] == ["gpu01"] and installs[0][1] == ei.wheelhouse(str(wheels), "0.11.0")
    assert _read(e, units).version == "0.11.0"
    # a second run: nothing to do anywhere
    assert all(not p.changes and p.error is None for p in op.plan())

    # the console script was pointed from the temp venv to the final path, and runs
    assert subprocess.run([e.path, "--version"], capture_output=True, text=True, timeout=30).stdout == "0.11.0\n"
    assert sorted(p.name for p in (tmp_path / "opt").iterdir()) == ["vllm-0.11.0"]  # no temp dir, no wheelhouse
    assert not (tmp_path / "opt/vllm-0.11.0/.wheelhouse").exists()
    before = sorted(str(p) for p in (tmp_path / "opt/vllm-0.11.0").rglob("*"))
    # the script itself never touches an existing path (the plan says unchanged before it gets there)
    again = _sh(ei.install_script(e, "wheels"), b"")
    assert again.returncode == 1 and b"exists: not touched" in again.stderr

    # an install killed mid-way: the other engine untouched, the new path absent (only a temp dir)
    build_wheel(wheels, "0.12.0")
    e2 = Engine("vllm-0.12", f"{tmp_path}/opt/vllm-0.12.0/bin/vllm", "0.12.0")
    proc = subprocess.Popen(
        ["sh", "-c", ei.install_script(e2, "wheels")],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    end = time.monotonic() + 60
    while not list((tmp_path / "opt").glob(".vllm-0.12.0.clusterctl-tmp.*/bin")) and time.monotonic() < end:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert list((tmp_path / "opt").glob(".vllm-0.12.0.clusterctl-tmp.*"))  # it was mid-way
    assert not (tmp_path / "opt/vllm-0.12.0").exists() and _read(e2, units).state == "missing"
    assert sorted(str(p) for p in (tmp_path / "opt/vllm-0.11.0").rglob("*")) == before

    # remove refused on the host whose unit runs it (named), by the plan and by the node script
    (units / "clusterctl-a.service").write_text(f"[Service]\nExecStart={e.path} serve /m --port 8000\n")
    rm = ei.EngineOp(
        _inv(e, hosts[:1]),
        e.name,
        hosts[:1],
        lambda hs: Fleet(list(hs), transport=transport),
        remove=True,
        sudo=False,
        units_dir=str(units),
    )
    p = rm.plan()[0]
    assert "clusterctl-a.service" in (p.error or "") and not p.changes
    rep = rm.run([p])
    assert not rep.ok and rep.outcomes[0].status == "refused" and Path(e.path).exists()  # read: not "unread"
    refused = _sh(ei.remove_script(e, str(units)))
    assert refused.returncode == 1 and b"clusterctl-a.service runs" in refused.stderr and Path(e.path).exists()
    # once no unit runs it: removed, and read again as missing
    (units / "clusterctl-a.service").unlink()
    rep = rm.run()
    assert rep.ok and rep.outcomes[0].status == "changed"
    assert not (tmp_path / "opt/vllm-0.11.0").exists()
    assert [o.status for o in rm.run().outcomes] == ["unchanged"]


def test_install_needs_one_source_and_a_known_engine(tmp_path: Path) -> None:
    e = Engine("vllm-0.11", "/opt/vllm-0.11.0/bin/vllm", "0.11.0")
    hosts = [Host("gpu01", "10.0.0.1")]
    inv = _inv(e, hosts)
    with pytest.raises(ClusterctlError, match="no engine vllm-9"):
        ei.EngineOp(inv, "vllm-9", hosts, lambda hs: Fleet(list(hs), transport=FakeTransport()))
    op = ei.EngineOp(inv, e.name, hosts, lambda hs: Fleet(list(hs), transport=FakeTransport()))
    with pytest.raises(ClusterctlError, match="--wheels DIR .* or --index-url"):
        op.run([])


def test_an_index_url_travels_on_stdin_never_on_the_command_line() -> None:
    e = Engine("vllm-0.11", "/opt/vllm-0.11.0/bin/vllm", "0.11.0")
    hosts = [Host("gpu01", "10.0.0.1", ssh=SSHSettings(user="root"))]
    url = "http://user:s3cret@mirror.invalid/simple"
    done: list[bool] = []

    def handler(host: Host, command: str, stdin: bytes | None) -> FakeReply:
        if "engine install" in command:
            done.append(True)
            return FakeReply(0, "installed /opt/vllm-0.11.0 0.11.0\n")
        if done:
            return FakeReply(0, f"engine {e.path} installed\ndist {e.path} vllm-0.11.0.dist-info\n")
        return FakeReply(0, f"engine {e.path} missing\n")

    transport = FakeTransport(handler)
    op = ei.EngineOp(
        _inv(e, hosts), e.name, hosts, lambda hs: Fleet(list(hs), transport=transport), index_url=url, sudo=False
    )
    rep = op.run()
    assert rep.ok and [o.status for o in rep.outcomes] == ["changed"]
    [(cmd, stdin)] = [(c, s) for _, c, s in transport.commands if "engine install" in c]
    assert "s3cret" not in cmd and "IFS= read -r PIP_INDEX_URL" in cmd and stdin == (url + "\n").encode()
    assert all("s3cret" not in c for _, c, _ in transport.commands)


def test_a_second_install_or_remove_under_the_same_parent_is_refused_while_one_runs(tmp_path: Path) -> None:
    e = Engine("vllm-0.12", f"{tmp_path}/opt/vllm-0.12.0/bin/vllm", "0.12.0")
    (tmp_path / "opt").mkdir()
    holder = subprocess.Popen(["flock", str(tmp_path / "opt"), "sleep", "60"], start_new_session=True)
    try:
        end = time.monotonic() + 30  # wait until the holder has it
        while subprocess.run(["flock", "-n", str(tmp_path / "opt"), "true"]).returncode == 0:
            assert time.monotonic() < end
            time.sleep(0.05)
        for script in (ei.install_script(e, "wheels"), ei.remove_script(e, str(tmp_path))):
            r = _sh(script, b"")
            assert r.returncode == 1 and b"another clusterctl engine install or remove under " in r.stderr, r.stderr
        assert list((tmp_path / "opt").iterdir()) == []  # nothing started, nothing left
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)


def test_an_engine_whose_vllm_version_hangs_is_not_installed(tmp_path: Path) -> None:
    """``vllm --version`` runs under a timeout: a CLI that never answers fails the host, nothing at the path."""
    wheels = tmp_path / "w"
    build_wheel(wheels, "0.12.0", version_body="time.sleep(60)")
    e = Engine("vllm-0.12", f"{tmp_path}/opt/vllm-0.12.0/bin/vllm", "0.12.0")
    r = _sh(ei.install_script(e, "wheels", version_timeout=2), ei.wheelhouse(str(wheels), "0.12.0"))
    assert r.returncode == 1 and b"failed: bin/vllm --version did not answer within 2 s" in r.stderr, r.stderr
    assert list((tmp_path / "opt").iterdir()) == []
