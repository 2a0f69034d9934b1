"""Exit codes are part of the interface: usage errors must read as UNKNOWN (3)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from clusterctl.cli.main import main
from clusterctl.exitcodes import ExitCode


def test_unknown_option_is_unknown_not_crit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--no-such-option"]) == ExitCode.UNKNOWN
    assert "No such option" in capsys.readouterr().err


def test_unknown_command_is_unknown() -> None:
    assert main(["no-such-command"]) == ExitCode.UNKNOWN


def test_bare_invocation_prints_help_and_succeeds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert "Usage:" in out and "inventory" in out


def test_planned_monitoring_command_says_so_and_exits_unknown(capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from clusterctl.cli import planned

    monkeypatch.setitem(planned.PLANNED, "autoscale", ("Scale templates by load [planned].", 13))
    assert main(["autoscale"]) == ExitCode.UNKNOWN
    assert "issue #13" in capsys.readouterr().err


def test_help_lists_every_command_group(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--help"])
    out = capsys.readouterr().out
    for group in ("inventory", "exec", "ping", "facts", "lab", "deploy", "doctor", "report"):
        assert group in out, group


def test_console_script_exit_code_reaches_the_shell() -> None:
    proc = subprocess.run([sys.executable, "-m", "clusterctl.cli.main", "--bogus"],
                          capture_output=True, text=True)
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr
