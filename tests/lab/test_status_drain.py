"""``clusterctl status`` and drained ``stop``/``restart`` against simulator units on the lab.

Two simulator instances run as ``clusterctl-NAME.service`` units (written
here, with the ``[X-Clusterctl]`` section deploy writes): ``st-a`` (vLLM 0.11)
on the first host, ``st-b`` (0.33) on the second, which logs in as a
non-root user with sudo.  The inventory wants a third, ``st-c``, that no host
runs.  Requests are slowed with the simulator's slow-down fault so streams
last seconds while start-up stays fast (time scale 0.05).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from clusterctl.cli.main import main

from support.http import wait_healthy

MODEL = "/models/qwen3-8b"
PORT = 8100
MAX_SEQS = 8
UNIT_SCRIPT = """
set -e
N=$1; E=$2; V=$3
vllm-sim make-model qwen3-8b {model} --sparse >/dev/null
cat > /etc/systemd/system/.clusterctl-$N.service.tmp <<UNIT
[Unit]
Description=clusterctl instance $N (status lab test)

[Service]
Type=exec
Environment=VLLM_SIM_TIME_SCALE=0.05 CUDA_VISIBLE_DEVICES=0
ExecStart=$E serve {model} --port {port} --max-model-len 8192 --served-model-name qwen3-8b --gpu-memory-utilization 0.4 --max-num-seqs {seqs}

[X-Clusterctl]
Instance=$N
Model=qwen3-8b
ModelVersion=2025-04-29
Engine=$(basename $(dirname $(dirname $E)))
EngineVersion=$V
GPUs=0
Port={port}
UNIT
mv /etc/systemd/system/.clusterctl-$N.service.tmp /etc/systemd/system/clusterctl-$N.service
systemctl daemon-reload
systemctl restart clusterctl-$N.service
""".format(model=MODEL, port=PORT, seqs=MAX_SEQS)

INSTANCES = {"st-a": (0, "/opt/vllm-0.11/bin/vllm", "0.11.0"), "st-b": (1, "/opt/vllm-0.33/bin/vllm", "0.33.0")}


@pytest.fixture(scope="module")
def setup(lab, tmp_path_factory):
    names = lab.names[:2]
    hosts = {inst: names[i] for inst, (i, _, _) in INSTANCES.items()}
    text = Path(lab.inventory).read_text()
    text += (
        f"models:\n  qwen3-8b: {{path: {MODEL}, version: '2025-04-29', served_name: qwen3-8b}}\n"
        "instances:\n"
        f"  st-a: {{model: qwen3-8b, engine: vllm-0.11, placement: '{hosts['st-a']}:0', port: {PORT},"
        f" args: {{max-num-seqs: {MAX_SEQS}}}}}\n"
        f"  st-b: {{model: qwen3-8b, engine: vllm-0.33, placement: '{hosts['st-b']}:0', port: {PORT}}}\n"
        f"  st-c: {{model: qwen3-8b, engine: vllm-0.11, placement: '{hosts['st-b']}:1', port: {PORT + 1}}}\n"
    )
    d = tmp_path_factory.mktemp("status")
    inv = d / "inventory.yaml"
    inv.write_text(text)
    for inst, (i, launcher, version) in INSTANCES.items():
        lab.run(hosts[inst], f"bash -s {inst} {launcher} {version}", input=UNIT_SCRIPT, check=True, timeout=120)
    urls = {inst: f"http://{lab.host(hosts[inst]).address}:{PORT}" for inst in INSTANCES}
    for inst in INSTANCES:
        wait_healthy(lab, hosts[inst], urls[inst] + "/health", f"clusterctl-{inst}.service", timeout=90)
    yield {"inv": str(inv), "hosts": hosts, "urls": urls, "state": str(d / "state")}
    for inst, host in hosts.items():
        lab.run(
            host,
            f"systemctl stop clusterctl-{inst}.service; rm -f /etc/systemd/system/clusterctl-{inst}.service;"
            " systemctl daemon-reload; systemctl reset-failed",
            timeout=120,
        )


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def _status(capsys, setup, *args: str) -> tuple[int, dict]:
    rc, out, err = _cli(capsys, "status", *args, "-i", setup["inv"], "--state-dir", setup["state"], "--json")
    assert out, err
    return rc, {r["name"]: r for r in json.loads(out)["instances"]}


def _slow(lab, setup, inst: str, factor: int) -> None:
    """The simulator's slow-down fault (loopback only): every engine step ``factor`` x longer."""
    body = json.dumps({"fault": "slowdown", "factor": factor} if factor > 1 else {"fault": "clear"})
    post = (
        "import sys, urllib.request; urllib.request.urlopen(urllib.request.Request("
        f"'http://127.0.0.1:{PORT}/sim/fault', data=sys.stdin.read().encode()), timeout=10)"
    )
    lab.run(setup["hosts"][inst], f'python3 -c "{post}"', input=body, check=True)


def _stream(url: str, max_tokens: int, result: dict, started: threading.Event | None = None) -> None:
    """One streamed completion; ``result``: ``done`` (ended with [DONE]), ``chunks``, ``error``."""
    req = urllib.request.Request(
        url + "/v1/completions",
        headers={"Content-Type": "application/json"},
        data=json.dumps(
            {
                "model": "qwen3-8b",
                "prompt": "tell me a long story",
                "max_tokens": max_tokens,
                "ignore_eos": True,
                "stream": True,
            }
        ).encode(),
    )
    result.update(done=False, chunks=0, error=None)
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            for raw in r:
                line = raw.decode().strip()
                if line.startswith("data: "):
                    result["chunks"] += 1
                    if started is not None and result["chunks"] == 3:
                        started.set()
                    if line == "data: [DONE]":
                        result["done"] = True
    except Exception as e:  # the cut stream is what some tests expect
        result["error"] = f"{type(e).__name__}: {e}"
    finally:
        if started is not None:
            started.set()


def test_status_shows_units_health_versions_and_absent(capsys, setup):
    rc, rows = _status(capsys, setup, "st-a,st-b", "--window", "1")
    assert rc == 0, rows
    a, b = rows["st-a"], rows["st-b"]
    assert (a["state"], a["active"], a["healthy"], a["running_version"], a["engine_version"]) == (
        "serving",
        "active",
        True,
        "0.11.0",
        "0.11.0",
    )
    assert (b["state"], b["running_version"], b["model_version"], b["gpus"]) == (
        "serving",
        "0.33.0",
        "2025-04-29",
        [f"{setup['hosts']['st-b']}:0"],
    )
    assert a["load"] is not None and a["load"] < 0.2 and a["restarts"] == 0 and a["up_s"] >= 0
    rc, rows = _status(capsys, setup, "--window", "0")
    assert rc == 2 and rows["st-c"]["state"] == "absent" and rows["st-c"]["severity"] == "CRIT"
    rc, out, _ = _cli(capsys, "status", "-i", setup["inv"], "--state-dir", setup["state"], "--window", "0")
    lines = out.splitlines()
    assert rc == 2 and any("st-a" in ln and "serving" in ln for ln in lines)
    assert any("st-c" in ln and "absent" in ln for ln in lines)


def test_load_score_rises_under_concurrent_streams(lab, capsys, setup):
    _, idle = _status(capsys, setup, "st-a,st-b", "--window", "1")
    _slow(lab, setup, "st-a", 10)
    try:
        results = [dict() for _ in range(3 * MAX_SEQS)]
        with cf.ThreadPoolExecutor(len(results)) as pool:
            futs = [pool.submit(_stream, setup["urls"]["st-a"], 3000, r) for r in results]
            time.sleep(2)
            rc, busy = _status(capsys, setup, "st-a,st-b", "--window", "2")
            _slow(lab, setup, "st-a", 1)
            for f in futs:
                f.result(timeout=120)
    finally:
        _slow(lab, setup, "st-a", 1)
    a = busy["st-a"]
    assert a["running"] == MAX_SEQS and a["waiting"] == 2 * MAX_SEQS, a
    assert a["kv_usage"] > 0 and a["tokens_per_s"] > 0
    # A queue of two batches is a full queue (0.4) on top of KV use and throughput (its own peak).
    assert a["load"] > idle["st-a"]["load"] + 0.4 and a["load"] > busy["st-b"]["load"] + 0.4
    assert a["severity"] in ("OK", "WARN") and rc in (0, 1)
    assert all(r["done"] for r in results), [r for r in results if not r["done"]][:2]


def _stop_during_stream(lab, capsys, setup, *, slow: int, max_tokens: int, drain_timeout: float):
    """Start a slow stream on st-a, then ``clusterctl stop st-a`` once it produces chunks.

    Returns ``(rc, the stop's JSON result row, seconds the stop took, the stream's result)``.
    """
    _slow(lab, setup, "st-a", slow)
    result: dict = {}
    started = threading.Event()
    t = threading.Thread(target=_stream, args=(setup["urls"]["st-a"], max_tokens, result, started))
    t.start()
    assert started.wait(30)
    t0 = time.monotonic()
    rc, out, err = _cli(
        capsys,
        "stop",
        "st-a",
        "-i",
        setup["inv"],
        "--state-dir",
        setup["state"],
        "--drain-timeout",
        str(drain_timeout),
        "--poll",
        "0.2",
        "--json",
    )
    took = time.monotonic() - t0
    t.join(60)
    assert out, err
    return rc, json.loads(out)["results"][0], took, result


def test_stop_waits_for_the_stream_in_flight_then_start(lab, capsys, setup):
    host = setup["hosts"]["st-a"]
    rc, res, took, result = _stop_during_stream(lab, capsys, setup, slow=10, max_tokens=600, drain_timeout=60)
    assert rc == 0, res
    assert res["drain"]["drained"] and not res["drain"]["timed_out"] and res["drain"]["waited_s"] > 0.5
    assert result["done"] and result["error"] is None, result
    assert lab.run(host, "systemctl is-active clusterctl-st-a.service").stdout.strip() == "inactive"
    rc, rows = _status(capsys, setup, "st-a", "--window", "0")
    assert rc == 2 and rows["st-a"]["state"] == "stopped"

    rc, out, err = _cli(
        capsys,
        "start",
        "st-a",
        "-i",
        setup["inv"],
        "--state-dir",
        setup["state"],
        "--health-timeout",
        "90",
        "--poll",
        "0.5",
    )
    assert rc == 0 and "ok start st-a" in out, out + err
    rc, rows = _status(capsys, setup, "st-a", "--window", "0")
    assert rc == 0 and rows["st-a"]["state"] == "serving"


def test_drain_timeout_bounds_the_stop_and_restart_comes_back(lab, capsys, setup):
    rc, res, took, result = _stop_during_stream(lab, capsys, setup, slow=20, max_tokens=3000, drain_timeout=1)
    assert rc == 0 and res["ok"], res
    assert res["drain"]["timed_out"] and res["drain"]["remaining"] == 1, res
    assert took < 15, took
    assert not result["done"], result  # the timeout bounds the wait: that stream was cut
    rc, out, err = _cli(
        capsys,
        "restart",
        "st-a",
        "-i",
        setup["inv"],
        "--state-dir",
        setup["state"],
        "--health-timeout",
        "90",
        "--poll",
        "0.5",
        "--json",
    )
    res = json.loads(out)["results"][0]
    assert rc == 0 and res["ok"] and res["healthy_after_s"] is not None, out + err
    assert lab.run(setup["hosts"]["st-a"], "systemctl is-active clusterctl-st-a.service").stdout.strip() == "active"
