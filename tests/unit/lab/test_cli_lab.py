"""`clusterctl lab` as a user meets it without root: clear errors, exit 3."""

from __future__ import annotations

import pytest

from clusterctl.cli import lab as cli_lab
from clusterctl.cli.main import main
from clusterctl.errors import LabError
from clusterctl.lab import faults, manager
from clusterctl.lab.config import LabConfig, plan_hosts


@pytest.fixture
def not_root(monkeypatch):
    monkeypatch.setattr(manager.os, "geteuid", lambda: 1000)


@pytest.mark.parametrize(
    "argv", [["lab", "up"], ["lab", "down"], ["lab", "heal"], ["lab", "inject", "lab01", "cut"], ["lab", "template"]]
)
def test_root_only_commands_say_so_and_exit_3(not_root, capsys, argv):
    assert main(argv) == 3
    err = " ".join(capsys.readouterr().err.split())
    assert "the lab needs root" in err and "Traceback" not in err


def test_status_without_a_lab_exits_3(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("CLUSTERCTL_LAB_DIR", str(tmp_path / "none"))
    assert main(["lab", "status"]) == 3
    assert "no lab is up" in capsys.readouterr().out


def test_ssh_to_an_unknown_lab_is_explained(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("CLUSTERCTL_LAB_DIR", str(tmp_path / "none"))
    assert main(["lab", "ssh", "lab01"]) == 3
    # (rich may wrap the line: compare words)
    assert "run `clusterctl lab up` first" in " ".join(capsys.readouterr().err.split())


def test_bad_lab_env_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setenv("CLUSTERCTL_LAB_NET", "1.2.3")
    assert main(["lab", "status"]) == 3
    assert "two octets" in capsys.readouterr().err


@pytest.mark.parametrize("cmd", ["up", "down", "status", "ssh", "inject", "heal", "template"])
def test_every_command_has_an_example(cmd, capsys):
    assert main(["lab", cmd, "--help"]) == 0
    assert "Example: " in capsys.readouterr().out


def test_fault_options_become_key_value_pairs():
    assert cli_lab._option_pairs(["--gpu", "3", "--code=79", "nic=eth2", "--on"]) == [
        "gpu=3",
        "code=79",
        "nic=eth2",
        "on=true",
    ]


def test_stray_fault_argument_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setattr(manager.os, "geteuid", lambda: 0)
    monkeypatch.setattr(manager.shutil, "which", lambda t: "/bin/" + t)
    monkeypatch.setattr(manager, "find_host", lambda cfg, name: plan_hosts(cfg, 1)[0])
    assert main(["lab", "inject", "lab01", "xid", "oops"]) == 3
    assert "unexpected argument 'oops'" in capsys.readouterr().err


def test_hardware_faults_are_dispatched_with_typed_options(monkeypatch, tmp_path):
    seen = {}

    class FakeHw:
        FAULTS = {"xid": None}

        @staticmethod
        def parse_options(fault, pairs):
            return {k: int(v) for k, v in (p.split("=") for p in pairs)}

        @staticmethod
        def inject(host_dir, fault, **opts):
            seen.update(host_dir=host_dir, fault=fault, **opts)
            return "xid injected"

    monkeypatch.setattr(faults, "_hardware_faults", lambda: FakeHw)
    cfg = LabConfig(lab_dir=tmp_path)
    h = plan_hosts(cfg, 1)[0]
    assert faults.inject(cfg, h, "xid", options=["gpu=3"]) == "lab01: xid injected"
    assert seen == {"host_dir": tmp_path / "hosts/lab01", "fault": "xid", "gpu": 3}
    with pytest.raises(LabError, match="unknown fault 'meteor'; known: bandwidth, loss, cut, freeze, thaw, xid"):
        faults.inject(cfg, h, "meteor")
    with pytest.raises(LabError, match="takes no option"):
        faults.inject(cfg, h, "cut", options=["gpu=1"])
    with pytest.raises(LabError, match="network-fault options"):
        faults.inject(cfg, h, "xid", rate="1mbit")
