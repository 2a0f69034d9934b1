"""``clusterctl engine list``: the read run by ``sh`` against engine trees built here
(a pip-installed virtualenv, a bare script, a file without the x bit, nothing) and
unit files that run them; the rows and the CLI's exit codes."""

from __future__ import annotations

import subprocess
from pathlib import Path

from clusterctl.bringup import engines as eng
from clusterctl.inventory.model import Engine


def _tree(tmp: Path) -> tuple[list[Engine], Path]:
    venv = tmp / "vllm-0.11"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/vllm").write_text("#!/bin/sh\n")
    (venv / "bin/vllm").chmod(0o755)
    (venv / "lib/python3.12/site-packages/vllm-0.11.0.dist-info").mkdir(parents=True)
    other = tmp / "vllm-0.33"
    (other / "bin").mkdir(parents=True)
    (other / "bin/vllm").write_text("#!/bin/sh\n")
    (other / "bin/vllm").chmod(0o755)
    (other / "lib/python3.11/site-packages/vllm-0.32.1.dist-info").mkdir(parents=True)
    noexec = tmp / "vllm-x/bin/vllm"
    noexec.parent.mkdir(parents=True)
    noexec.write_text("")
    units = tmp / "units"
    units.mkdir()
    (units / "clusterctl-a.service").write_text(
        f"[Service]\nUser=vllm\nExecStart={venv}/bin/vllm serve /models/a \\\n  --port 8000\n"
    )
    (units / "clusterctl-b.service").write_text(f"[Service]\nExecStart={venv}/bin/vllm-other serve /m\n")
    return [
        Engine("vllm-0.11", f"{venv}/bin/vllm", "0.11.0"),
        Engine("vllm-0.33", f"{other}/bin/vllm", "0.33.0"),
        Engine("vllm-x", str(noexec), "0.20.0"),
        Engine("vllm-none", f"{tmp}/absent/bin/vllm", "0.11.0"),
    ], units


def test_each_engine_state_version_and_the_units_that_run_it(tmp_path: Path) -> None:
    engines, units = _tree(tmp_path)
    out = subprocess.run(
        ["sh", "-c", eng.read_command(engines, str(units))], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    rows = {r.engine: r for r in eng.parse_read("gpu01", engines, out)}
    a = rows["vllm-0.11"]
    assert (a.state, a.version, a.version_matches) == ("installed", "0.11.0", True)
    # the unit's ExecStart runs this exact path (not bin/vllm-other); systemctl does not know it here
    assert [u for u, _ in a.units] == ["clusterctl-a.service"]
    b = rows["vllm-0.33"]
    assert (b.state, b.version, b.version_matches, b.units) == ("installed", "0.32.1", False, [])
    assert rows["vllm-x"].state == "not-executable" and rows["vllm-x"].version is None
    none = rows["vllm-none"]
    assert (none.state, none.version, none.version_matches) == ("missing", None, None)


def test_a_path_the_read_did_not_answer_is_unread_never_missing() -> None:
    engines = [Engine("e1", "/opt/e1/bin/vllm", "0.11.0"), Engine("e2", "/opt/e2/bin/vllm", "0.11.0")]
    rows = eng.parse_read("gpu01", engines, "engine /opt/e1/bin/vllm installed\n")
    assert [(r.engine, r.state) for r in rows] == [("e1", "installed"), ("e2", "unread")]
    assert rows[1].error
    # a local build records e.g. 0.32.0+cpu: the same release as the inventory's 0.32.0
    r = eng.EngineRow("h", "e", "/p", "0.32.0", "installed", version="0.32.0+cpu")
    assert r.version_matches is True
