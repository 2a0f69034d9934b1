"""Gathering, quoting helpers and the @failed store."""

from __future__ import annotations

import json
import subprocess

import pytest

from clusterctl.fleet import shell
from clusterctl.fleet.failed import FILENAME, load_failed, save_failed
from clusterctl.fleet.results import HostResult, HostStatus, RunResults, _fold_fallback, fold

HOSTILE = [
    "; touch /tmp/pwned",
    "$(touch /tmp/pwned)",
    "`touch /tmp/pwned`",
    "a'b\"c",
    "line1\nline2; touch /tmp/pwned",
    "*",
    "--help",
    "",
    "\\",
    "${IFS}x",
]


def test_fold_fallback():
    assert _fold_fallback(["gpu01", "gpu02", "gpu03", "gpu07", "cpu1", "x"]) == "gpu[01-03,07],cpu1,x"
    assert _fold_fallback(["n9", "n10", "n11"]) == "n[9-11]"
    assert fold(["a1"]) == "a1"


def test_gather_groups_identical_and_orders_ok_first():
    rows = [
        HostResult("n1", HostStatus.FAILED, 1, "", "e"),
        HostResult("n2", HostStatus.OK, 0, "x"),
        HostResult("n3", HostStatus.OK, 0, "x"),
        HostResult("n4", HostStatus.FAILED, 1, "", "e"),
        HostResult("n5", HostStatus.UNREACHABLE, error="connection refused"),
        HostResult("n6", HostStatus.FAILED, 1, "", "other"),
    ]
    g = RunResults(rows).gather()
    assert [(x.status.value, x.nodeset) for x in g] == [
        ("ok", "n[2-3]"),
        ("failed", "n[1,4]"),
        ("unreachable", "n5"),
        ("failed", "n6"),
    ]
    d = RunResults(rows).to_dict()
    assert d["counts"] == {"failed": 3, "ok": 2, "unreachable": 1} and d["worst_rc"] == 255
    json.dumps(d)


@pytest.mark.parametrize("value", HOSTILE)
def test_quote_round_trips_through_a_real_shell(value, tmp_path):
    out = subprocess.run(
        ["sh", "-c", "printf '%s' " + shell.quote(value)], capture_output=True, text=True, cwd=tmp_path, check=True
    ).stdout
    assert out == value
    assert list(tmp_path.iterdir()) == []


def test_join_and_env_and_sh_c(tmp_path):
    marker = tmp_path / "pwned"
    cmd = shell.with_env(
        "printenv V; printf '%s|' " + shell.join(["a b", f"; touch {marker}"]), {"V": f"$(touch {marker})"}
    )
    out = subprocess.run(["sh", "-c", shell.sh_c(cmd)], capture_output=True, text=True).stdout
    assert out == f"$(touch {marker})\na b|; touch {marker}|"
    assert not marker.exists()
    with pytest.raises(ValueError):
        shell.with_env("true", {"A;B": "x"})


def test_require_python3_marker(tmp_path):
    r = subprocess.run(
        ["sh", "-c", shell.require_python3("echo ran")],
        capture_output=True,
        text=True,
        env={"PATH": str(tmp_path)},
        executable="/bin/sh",
    )
    assert r.returncode == 127 and shell.NO_PYTHON_MARKER in r.stderr and "ran" not in r.stdout


def test_sudo_wrappers_keep_command_quoted():
    assert shell.sudo("echo 'a'", with_password=False) == "sudo -n -- sh -c 'echo '\"'\"'a'\"'\"''"
    w = shell.sudo("id; echo $(x)", with_password=True)
    assert w.startswith("sh -c ") and w.endswith(" sh 'id; echo $(x)'")


def test_failed_store_roundtrip_atomic_and_scoped(tmp_path):
    inv = str(tmp_path / "inv.yaml")
    p = save_failed(tmp_path / "state", ["gpu01", "gpu03"], inventory=inv, command="true")
    assert p.name == FILENAME
    assert load_failed(tmp_path / "state", inventory=inv) == ["gpu01", "gpu03"]
    assert load_failed(tmp_path / "state", inventory=str(tmp_path / "other.yaml")) is None
    assert load_failed(tmp_path / "state") == ["gpu01", "gpu03"]
    save_failed(tmp_path / "state", [], inventory=inv)
    assert load_failed(tmp_path / "state", inventory=inv) == []
    assert [f.name for f in (tmp_path / "state").iterdir()] == [FILENAME]  # no temp files left
    (tmp_path / "state" / FILENAME).write_text("{not json")
    assert load_failed(tmp_path / "state") is None
    assert load_failed(tmp_path / "nowhere") is None
