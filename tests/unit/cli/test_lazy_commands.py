"""The CLI imports only the command module it runs; --help still lists every command."""

from __future__ import annotations

import subprocess
import sys

import pytest
import typer

from clusterctl.cli import main as cli_main
from clusterctl.cli.main import main

EVERY_COMMAND = ("inventory", "exec", "ping", "facts", "lab", "stage", "deploy", "doctor", "report")


@pytest.mark.parametrize("name", sorted(cli_main._OWNER))
def test_the_owner_map_names_the_module_that_registers_the_command(name: str) -> None:
    group = typer.main.get_command(cli_main.build_app(name))
    assert name in group.commands  # type: ignore[attr-defined]


def test_help_after_a_single_command_run_still_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["exec", "--help"]) == 0
    capsys.readouterr()
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in EVERY_COMMAND:
        assert f" {name} " in out, name


def test_unknown_command_gets_the_full_app_and_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["exe", "all", "--", "true"]) == 3
    assert "No such command 'exe'" in capsys.readouterr().err


def test_exec_does_not_import_the_probe_the_lab_or_a_progress_bar() -> None:
    code = (
        "import sys\nfrom clusterctl.cli.main import main\nrc = main(['exec', '--help'])\n"
        "print(rc, sorted(m for m in ('clusterctl.probe.run', 'clusterctl.lab.light', 'clusterctl.cli.lab',"
        " 'clusterctl.cli.facts', 'rich.progress', 'rich.table') if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip().splitlines()[-1] == "0 []", proc.stdout + proc.stderr


def test_help_imports_no_workflow_no_deploy_and_no_gateway_package() -> None:
    """``clusterctl --help`` (and shell completion) loads every command module but none of the
    workflows or engines under them: those are imported when a command runs."""
    code = (
        "import sys\nfrom clusterctl.cli.main import main\nrc = main(['--help'])\n"
        "print(rc, sorted(m for m in sys.modules if m.split('.')[:2] in (['clusterctl', 'ops'],"
        " ['clusterctl', 'deploy'], ['clusterctl', 'gateway'], ['clusterctl', 'stage'])))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.strip().splitlines()[-1] == "0 []", proc.stdout + proc.stderr
