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


def test_planned_monitoring_command_says_so_and_exits_unknown(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from clusterctl.cli import planned

    monkeypatch.setitem(planned.PLANNED, "rebalance", ("Move replicas between hosts [planned].", 13))
    assert main(["rebalance"]) == ExitCode.UNKNOWN
    assert "issue #13" in capsys.readouterr().err


def test_help_lists_every_command_group(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--help"])
    out = capsys.readouterr().out
    for group in ("inventory", "exec", "ping", "facts", "lab", "deploy", "doctor", "report"):
        assert group in out, group


def test_console_script_exit_code_reaches_the_shell() -> None:
    proc = subprocess.run([sys.executable, "-m", "clusterctl.cli.main", "--bogus"], capture_output=True, text=True)
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr


def _boom(kind: type[BaseException]):
    def command() -> None:
        raise kind("bad\nthing")

    return command


@pytest.mark.parametrize("kind", [TypeError, MemoryError, RecursionError, KeyError, EOFError])
def test_an_unexpected_exception_is_one_line_and_unknown(
    kind: type[BaseException], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The safety net (issue 21): no traceback, exit 3 (not 1, which monitoring reads as WARN, nor 130)."""
    from clusterctl.cli import inventory

    monkeypatch.setattr(inventory.app, "registered_commands", list(inventory.app.registered_commands))
    inventory.app.command("boom")(_boom(kind))
    assert main(["inventory", "boom"]) == ExitCode.UNKNOWN
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "Traceback" not in err
    assert kind.__name__ in err and "--debug" in err
    assert main(["--debug", "inventory", "boom"]) == ExitCode.UNKNOWN
    assert "Traceback" in capsys.readouterr().err


def test_the_net_holds_in_a_real_process() -> None:
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from clusterctl.cli import main as m;"
            "m._OWNER['x']='inventory'; import clusterctl.cli.inventory as i;"
            "i.app.command('x-boom')(lambda: 1/0); sys.exit(m.main(['inventory','x-boom']))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 3 and "ZeroDivisionError" in p.stderr and "Traceback" not in p.stderr
