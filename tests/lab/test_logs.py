"""``clusterctl logs`` against the real journals of lab hosts (tier 2, root).

Transient units named like instance units (``systemd-run --unit clusterctl-NAME.service``)
write lines; ``logs`` reads them merged by time, follows them live, and leaves no
``journalctl -f`` behind on a host when it ends.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
import yaml

from clusterctl.cli.main import main

pytestmark = pytest.mark.lab


def _inventory(lab, tmp_path: Path, names: list[str]) -> Path:
    data = yaml.safe_load(Path(lab.inventory).read_text())
    data.setdefault("models", {})["logs-model"] = {
        "path": "/models/logs",
        "arch": {
            "layers": 2,
            "hidden_size": 64,
            "attention_heads": 4,
            "kv_heads": 4,
            "head_dim": 16,
            "vocab": 1000,
            "params": 1000000,
            "dtype": "bfloat16",
        },
    }
    engine = next(iter(data["engines"]))
    data["instances"] = {
        f"logt-{h}": {"model": "logs-model", "engine": engine, "placement": f"{h}:0", "port": 8000} for h in names
    }
    p = tmp_path / "inventory.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def _journalctls(lab, host: str) -> str:
    """The command lines of the journalctl processes running on ``host``."""
    return lab.run(host, "pgrep -a -x journalctl || true").stdout


def _emit(lab, host: str, text: str) -> None:
    lab.run(
        host, f"systemd-run --quiet --collect --unit=clusterctl-logt-{host}.service sh -c 'echo {text}'", check=True
    )


def test_logs_reads_and_follows_instance_journals_across_hosts(lab, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    names = lab.names[:2]
    inv = _inventory(lab, tmp_path, names)
    for i, h in enumerate(names):
        _emit(lab, h, f"first-{i}-{h}")
        time.sleep(0.05)
    time.sleep(0.5)
    assert main(["logs", "logt-*", "-i", str(inv), "--json", "--grep", "^first-"]) == 0
    docs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    firsts = [d for d in docs if d["message"].startswith("first-")]
    assert [(d["host"], d["source"]) for d in firsts][-2:] == [(h, f"logt-{h}") for h in names]
    assert firsts == sorted(firsts, key=lambda d: d["time"])

    # follow: a line written while following shows, and nothing is left running on the hosts
    def later() -> None:
        time.sleep(4)
        _emit(lab, names[-1], "during-follow")

    t = threading.Thread(target=later)
    t.start()
    t0 = time.monotonic()
    rc = main(["logs", "logt-*", "-i", str(inv), "-f", "-n", "0", "--for", "7", "--json"])
    took = time.monotonic() - t0
    t.join()
    out = capsys.readouterr().out
    assert rc == 0 and "during-follow" in out and 6 < took < 20, (rc, took, out)
    for h in names:
        assert "clusterctl-logt" not in _journalctls(lab, h)


def test_an_interrupted_follow_leaves_no_journalctl_behind(lab, tmp_path, monkeypatch):
    import signal
    import subprocess
    import sys

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    names = lab.names[:2]
    inv = _inventory(lab, tmp_path, names)
    # PYTHONFAULTHANDLER: if it does not exit, SIGABRT makes it print every thread's stack
    p = subprocess.Popen(
        [sys.executable, "-m", "clusterctl.cli.main", "logs", "logt-*", "-i", str(inv), "-f"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # wait until every host runs its journalctl -f
        if all("clusterctl-logt" in _journalctls(lab, h) for h in names):
            break
        time.sleep(0.5)
    else:
        p.kill()
        pytest.fail("the follow never started on every host")
    p.send_signal(signal.SIGINT)
    try:
        p.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGABRT)
        _, err = p.communicate(timeout=10)
        pytest.fail(f"logs -f still running 20 s after SIGINT; its threads:\n{err[-6000:]}")
    assert p.returncode == 0
    time.sleep(3)  # the heartbeat finds the closed channel within a second or two
    for h in names:
        assert "clusterctl-logt" not in _journalctls(lab, h)
