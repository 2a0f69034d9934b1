"""``bench`` and ``drift`` against a hostile server (#21): trickled headers, keep-alive trickles, endless lines,
junk numbers.  Each CLI run is a subprocess under a 1 GiB address-space cap and a wall-clock limit, so a
regression fails (MemoryError, a kill, a timeout) instead of taking the machine down; every run must end
within its --timeout plus start-up, with a clear error and no traceback."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.hostile_http import HostileServer

AS_LIMIT = 1 << 30  # bytes of address space for the CLI under attack
WALL = 40.0  # s: far above --timeout 2 plus imports, far below the 90-150 s the attacks used to last


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def _cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str, float]:
    """(exit status, stdout, stderr, seconds) of ``clusterctl ARGS`` in a capped subprocess."""
    code = "import sys; from clusterctl.cli.main import main; sys.exit(main(sys.argv[1:]))"
    t0 = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=WALL,
        preexec_fn=_limits,
        env={**os.environ, **(env or {})},
    )
    return p.returncode, p.stdout, p.stderr, time.monotonic() - t0


def _no_constant(name: str) -> None:
    raise AssertionError(f"{name} in JSON output")


STREAM_ATTACKS = {
    "headers_trickle": "within 2 s",
    "header_flood": "header over 64 KiB",
    "sse_trickle": "within 2 s",
    "token_trickle": "within 2 s",
    "endless_line": "SSE line over",
    "chunk_size_flood": "chunk-size line",
    "huge_usage": "usage.completion_tokens",
    "text_number": "'text' is not a string",
}


@pytest.mark.parametrize("mode", sorted(STREAM_ATTACKS))
def test_bench_ends_with_a_reason_whatever_the_server_sends(mode: str) -> None:
    with HostileServer(mode) as srv:
        # (huge_usage answers /tokenize with a completion: no token count, so words and a warning)
        words = ["--no-tokenizer"] if mode != "huge_usage" else []
        rc, out, err, took = _cli(
            "bench",
            srv.url,
            "-c",
            "2",
            "-n",
            "2",
            "--input-len",
            "4",
            "--output-len",
            "3",
            "--timeout",
            "2",
            *words,
            "--json",
        )
    assert "Traceback" not in err and took < 15, (took, err[-2000:])
    doc = json.loads(out, parse_constant=_no_constant)  # strict JSON: no NaN, no Infinity
    (level,) = doc["results"]
    assert rc == 2 and level["completed"] == 0 and level["failed"] == 2, out
    assert any(STREAM_ATTACKS[mode] in e for e in level["errors"]), level["errors"]
    assert doc["input_len_unit"] == "words" and ("/tokenize does not answer" in doc["warnings"][0]) == (not words)


def test_threaded_generator_has_the_same_deadline_and_line_cap() -> None:
    """The thread generator (drift's background traffic) against the trickle and the endless line."""
    from clusterctl.vllmclient import Endpoint, stream_completion

    for mode, reason in (
        ("token_trickle", "within 1 s"),
        ("headers_trickle", "within 1 s"),
        ("endless_line", "SSE line over"),
    ):
        with HostileServer(mode) as srv:
            t0 = time.monotonic()
            r = stream_completion(Endpoint.parse(srv.url), {"prompt": "x", "max_tokens": 3}, timeout=1)
            assert not r.ok and reason in r.error and time.monotonic() - t0 < 5, (mode, r.error)


DRIFT_ATTACKS = {
    "headers_trickle": "within 2 s",
    "body_trickle": "within 2 s",
    "body_flood": "over 16 MiB",
    "text_number": "'text' is not a string",
    "logprob_junk": "not a finite number",
    "header_flood": "header",
}


@pytest.mark.parametrize("mode", sorted(DRIFT_ATTACKS))
def test_drift_baseline_and_leak_end_with_a_reason(mode: str, tmp_path: Path) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path)}
    with HostileServer(mode) as srv:
        rc, out, err, took = _cli("drift", "baseline", srv.url, "--name", "b", "--timeout", "2", env=env)
        assert rc == 3 and "Traceback" not in err and took < 15, (rc, took, err[-2000:])
        assert DRIFT_ATTACKS[mode] in out + err, out + err
        assert not (tmp_path / "clusterctl" / "drift" / "baselines" / "b.json").exists()  # no junk baseline
        rc, out, err, took = _cli(
            "drift", "leak", srv.url, "--sessions", "2", "--requests", "1", "--timeout", "2", "--json", env=env
        )
    assert rc == 3 and "Traceback" not in err and took < 15, (rc, took, err[-2000:])
    assert json.loads(out)["status"] == "UNKNOWN"


def test_drift_check_has_a_timeout_and_a_junk_baseline_file_is_an_error(tmp_path: Path) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path)}
    base = tmp_path / "clusterctl" / "drift" / "baselines"
    base.mkdir(parents=True)
    item = {"id": "1", "prompt": "x", "text": " a b", "tokens": [" a", " b"], "top": [{" a": -0.1}, {" b": -0.1}]}
    (base / "good.json").write_text(json.dumps({"name": "good", "k": 2, "seed": 0, "env": {}, "items": [item]}))
    (base / "junk.json").write_text(
        json.dumps({"name": "junk", "k": 2, "seed": 0, "env": {}, "items": [{**item, "text": 12345}]})
    )
    with HostileServer("body_trickle") as srv:
        rc, out, err, took = _cli("drift", "check", srv.url, "--baseline", "good", "--timeout", "2", env=env)
        assert rc == 3 and "within 2 s" in out + err and took < 15, (rc, took, out, err[-2000:])
        rc, out, err, _ = _cli("drift", "check", srv.url, "--baseline", "junk", "--timeout", "2", env=env)
    assert rc == 3 and "not a readable baseline" in out + err and "'text' is not a string" in out + err
