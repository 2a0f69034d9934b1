"""`clusterctl exec` / `ping` through main(), with the fake transport (no network)."""

from __future__ import annotations

import json

import pytest

from clusterctl.fleet import ssh
from clusterctl.cli.main import main
from clusterctl.fleet.failed import load_failed
from clusterctl.fleet.transport import FakeReply, FakeTransport, HostFailure
from clusterctl.fleet.results import HostStatus

INVENTORY = """\
version: 1
defaults:
  ssh: {user: root}
hosts:
  gpu[01-04]:
    address: 10.0.0.[1-4]
"""


@pytest.fixture
def env(tmp_path, monkeypatch):
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    transport = FakeTransport()
    monkeypatch.setattr(ssh, "ParamikoTransport", lambda **kw: transport)  # the fleet factory's transport
    from clusterctl.clusterstate import default_cluster_name

    # @failed is kept in the inventory's cluster's state (docs/inventory.md "State per cluster")
    return inv, transport, tmp_path / "state" / "clusterctl" / "clusters" / default_cluster_name(str(inv))


def test_exec_gathers_identical_output_and_exits_worst_rc(env, capsys):
    inv, t, _ = env
    t.handler = lambda h, c, s: FakeReply(0, "6.1.0\n") if h.name != "gpu03" else FakeReply(2, "", "no\n")
    assert main(["exec", "-i", str(inv), "all", "--", "uname", "-r"]) == 2
    out, err = capsys.readouterr()
    assert out.count("6.1.0") == 1 and "gpu[01-02,04] (3)" in out and "gpu03 (1) rc=2" in out
    assert "4 hosts: 3 ok, 1 failed" in err
    assert t.commands[0][1] == "uname -r"


def test_exec_unreachable_exits_255_and_records_failed(env, capsys):
    inv, t, state = env
    t.on_connect = lambda h: (
        HostFailure(HostStatus.UNREACHABLE, "connection refused") if h.name in ("gpu02", "gpu04") else None
    )
    assert main(["exec", "-i", str(inv), "all", "--", "true"]) == 255
    assert "unreachable: gpu[02,04] (2): connection refused" in capsys.readouterr().err
    assert load_failed(state, inventory=str(inv)) == ["gpu02", "gpu04"]
    t.on_connect = None
    assert main(["exec", "-i", str(inv), "@failed", "--", "true"]) == 0
    assert sorted(h for h, _, _ in t.commands[-2:]) == ["gpu02", "gpu04"]
    assert load_failed(state, inventory=str(inv)) == []


def test_exec_json(env, capsys):
    inv, t, _ = env
    assert main(["exec", "-i", str(inv), "gpu[01-02]", "--json", "--", "echo", "hi"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["command"] == "echo hi" and data["worst_rc"] == 0
    assert [(g["nodes"], g["status"]) for g in data["groups"]] == [("gpu[01-02]", "ok")]
    assert [h["host"] for h in data["hosts"]] == ["gpu01", "gpu02"]


def test_ping_table_and_exit_codes(env, capsys):
    inv, t, _ = env
    assert main(["ping", "-i", str(inv), "all"]) == 0
    assert "4/4 hosts answered" in capsys.readouterr().out
    t.on_connect = lambda h: (
        HostFailure(HostStatus.AUTH_FAILED, "server refused every key") if h.name == "gpu01" else None
    )
    assert main(["ping", "-i", str(inv), "all", "--json"]) == 2
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False and data["counts"] == {"auth_failed": 1, "ok": 3}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["exec", "all", "--", "true"], "inv.yaml"),  # replaced below with a missing inventory
        (["exec", "nosuch", "--", "true"], "nosuch"),
        (["exec", "all", "--host-key-policy", "yes", "--", "true"], "accept-new, strict, off"),
        (["exec", "@failed", "--", "true"], "failed"),
    ],
)
def test_usage_errors_exit_3_without_traceback(env, capsys, argv, message, tmp_path):
    inv, _, _ = env
    target = str(tmp_path / "missing.yaml") if message == "inv.yaml" else str(inv)
    rc = main([argv[0], "-i", target] + argv[1:])
    err = capsys.readouterr().err
    assert rc == 3
    assert "Traceback" not in err
    assert (message if message != "inv.yaml" else "missing.yaml") in err


def test_exec_prints_command_output_verbatim(env, capsys):
    inv, t, _ = env
    line = "x" * 300 + " [bold]not markup[/bold]"
    t.handler = lambda h, c, s: FakeReply(0, line + "\n")
    assert main(["exec", "-i", str(inv), "all", "--", "true"]) == 0
    assert line + "\n" in capsys.readouterr().out
