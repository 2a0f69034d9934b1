"""Round robin, least_conn and least_score dispatch through the real nginx gateway.

On the lab: nginx + njs on the first host (``clusterctl gateway deploy``), 16
simulator instances serving a sparse Qwen3-8B on the next two hosts (8 GPUs
each; even GPUs with the ``h100-sxm`` latency profile, odd ones ``l40s-48g``:
a fleet with mixed GPUs, as in the field report), ``--max-num-seqs`` small
enough that a busy instance queues.  The workload: short requests (64-word
prompt, 24 tokens out) and long ones (1024-word prompt, 320 tokens out),
80/20, a quarter of them turns of 24 conversations (``X-Session-ID``),
shuffled with a fixed seed; a closed loop of ``--concurrency`` streaming
clients (this script's own, so sessions and TTFT percentiles are measured),
``--duration`` seconds per arm.

Arms, each on the same instances, one after the other (idle in between):

* ``round_robin``: the gateway rendered with ``dispatch: round_robin`` (nginx's round
  robin on the session-less upstream, hash on the session one), all weights equal;
* ``least_conn``: the gateway rendered with ``dispatch: least_conn``, all weights equal;
* ``least_score``: the gateway rendered with ``dispatch: least_score`` (the default), with
  ``clusterctl gateway sync --every S --window W`` running alongside: njs picks
  per request from the scores it posts (no reload).  The other arms run the
  same sync loop with ``--dry-run`` (same CPU, nothing applied).

Per arm: output and request throughput, TTFT mean/p50/p90/p99 (and p50/p90 of
the session turns), E2E p99, failed requests, sessions that changed instance,
each instance's share of the output tokens (``vllm:generation_tokens_total``
before/after), the last scores sync posted, and the machine's 1-minute load
average before and after.

An arm may be listed more than once (``--arms round_robin,least_conn,least_score,least_score,
least_conn,round_robin``: on a shared machine the load drifts, so each arm runs early and late);
``means`` and the gains over round robin are over each arm's runs.  ``--time-scale 4`` keeps 16
simulators and 64 clients within two vCPUs (TTFT and E2E are then wall-clock, 4x the simulated).

Run as root with the lab's environment (``CLUSTERCTL_LAB_*``; the lab is
brought up if needed and left up).  Usage:
``python benchmarks/gateway/dispatch.py [--concurrency 32] [--duration 40] [--time-scale 1.0]
[--arms round_robin,least_conn,least_score] [--profiles mixed|h100-sxm|l40s-48g]``.
Writes ``benchmarks/results/gateway-dispatch-<profiles>-<date>.json`` (temp file + rename).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

from clusterctl.lab.config import LabConfig  # noqa: E402
from clusterctl.lab.session import LabSession  # noqa: E402
from support.http import wait_healthy  # noqa: E402

MODEL_DIR = "/models/qwen3-8b"
GW_PORT = 8080
#: instance -> (lab host index, GPU, port, latency profile): 16 instances on two hosts' 8 GPUs,
#: the first host's H100 SXM, the second's L40S (the field report's mixed fleet; the inventory
#: says so, so gateway sync weighs them by measured throughput)
INSTANCES = {f"d{h}-{g}": (h, g, 8301 + g, "h100-sxm" if h == 1 else "l40s-48g") for h in (1, 2) for g in range(8)}
UNIT = """[Unit]
Description=clusterctl instance {name} (dispatch benchmark)

[Service]
Type=exec
Environment=VLLM_SIM_TIME_SCALE={scale} VLLM_SIM_PROFILE={profile} CUDA_VISIBLE_DEVICES={gpu}
ExecStart=/opt/vllm-0.11/bin/vllm serve {model_dir} --port {port} --served-model-name qwen3-8b --gpu-memory-utilization 0.9 --max-model-len 8192 --max-num-seqs {seqs}

[X-Clusterctl]
Instance={name}
Model=qwen3-8b
Engine=vllm-0.11
EngineVersion=0.11.0
GPUs={gpu}
Port={port}
"""
ARMS = ("round_robin", "least_conn", "least_score")
WORDS = (
    "the of and to in is was for on that with as by at from this are be it an or which have not one "
    "had were all their has more other been its can some there would when will into what time only"
).split()


def dataset(path: Path, lines: int, seed: int = 7) -> dict[str, Any]:
    """Write the mixed JSONL workload; returns its composition."""
    rng = random.Random(seed)
    rows = []
    for i in range(lines):
        long = i % 5 == 0
        n_in, n_out = (1024, 320) if long else (64, 24)
        row = {"prompt": " ".join(rng.choice(WORDS) for _ in range(n_in)), "output_len": n_out}
        if i % 4 == 1:  # a quarter of the requests are turns of 24 conversations
            row["session"] = f"conv-{rng.randrange(24)}"
        rows.append(row)
    rng.shuffle(rows)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {
        "lines": lines,
        "long_share": 0.2,
        "session_share": 0.25,
        "sessions": 24,
        "short": {"prompt_words": 64, "output_tokens": 24},
        "long": {"prompt_words": 1024, "output_tokens": 320},
    }


def profiles(kind: str) -> dict[str, str]:
    """Instance -> latency profile: ``mixed`` (two H100, two L40S, the default) or one profile for all."""
    return {n: (p if kind == "mixed" else kind) for n, (_, _, _, p) in INSTANCES.items()}


def setup(lab: LabSession, work: Path, scale: float, seqs: int, kind: str) -> dict[str, Any]:  # noqa: C901
    names = lab.names
    hosts = {n: names[i] for n, (i, _, _, _) in INSTANCES.items()}
    import yaml

    doc = yaml.safe_load(Path(lab.inventory).read_text())
    if kind == "mixed":  # the second instance host has L40S GPUs (a group's gpus override the defaults)
        doc.setdefault("groups", {})["bench_l40s"] = {
            "hosts": names[2],
            "gpus": {"count": 8, "model": "L40S-48GB", "memory_gib": 44.5, "interconnect": "pcie"},
        }
    text = yaml.safe_dump(doc, sort_keys=False) + (
        f"models:\n  qwen3-8b: {{path: {MODEL_DIR}, served_name: qwen3-8b}}\ninstances:\n"
    )
    for n, (_, gpu, port, _) in INSTANCES.items():
        text += (
            f"  {n}: {{model: qwen3-8b, engine: vllm-0.11, placement: '{hosts[n]}:{gpu}', port: {port}, "
            f"args: {{max-num-seqs: {seqs}}}}}\n"
        )  # the seats gateway sync scores against
    text += f"gateway:\n  hosts: {names[0]}\n  port: {GW_PORT}\n  max_conns: 256\n  sync_interval_s: 1\n  auth: none\n"
    invs = {arm: work / f"inventory-{arm}.yaml" for arm in ARMS}
    for arm, path in invs.items():  # each arm says its dispatch (a default can change)
        path.write_text(text + f"  dispatch: {arm}\n")
    inv = invs["least_score"]
    for n, (_, gpu, port, _) in INSTANCES.items():
        profile = profiles(kind)[n]
        unit = UNIT.format(name=n, gpu=gpu, port=port, profile=profile, scale=scale, seqs=seqs, model_dir=MODEL_DIR)
        path = f"/etc/systemd/system/clusterctl-{n}.service"
        lab.run(
            hosts[n],
            f"test -d {MODEL_DIR} || vllm-sim make-model qwen3-8b {MODEL_DIR} --sparse >/dev/null; "
            f"cat > {path}.tmp && mv {path}.tmp {path} && systemctl daemon-reload && "
            f"systemctl restart clusterctl-{n}.service",
            input=unit,
            check=True,
            timeout=300,
        )
    urls = {n: f"http://{lab.host(hosts[n]).address}:{INSTANCES[n][2]}" for n in INSTANCES}
    for n in INSTANCES:
        wait_healthy(lab, hosts[n], urls[n] + "/health", f"clusterctl-{n}.service", timeout=600)
    state = work / "state"
    rc = _cli("gateway", "deploy", names[0], "-i", str(inv), "--state-dir", str(state)).returncode
    assert rc == 0, "gateway deploy failed"
    return {
        "lab": lab,
        "inv": str(inv),
        "invs": {a: str(p) for a, p in invs.items()},
        "state": str(state),
        "hosts": hosts,
        "urls": urls,
        "gw_host": names[0],
        "gw": f"http://{lab.host(names[0]).address}:{GW_PORT}",
    }


def teardown(lab: LabSession, env: dict[str, Any]) -> None:
    for n, host in env["hosts"].items():
        lab.run(
            host,
            f"systemctl stop clusterctl-{n}.service; rm -f /etc/systemd/system/clusterctl-{n}.service; "
            "systemctl daemon-reload; systemctl reset-failed",
            timeout=120,
        )
    lab.run(env["gw_host"], "systemctl disable --now nginx.service", timeout=60)


def _cli(*args: str, capture: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "clusterctl.cli.main", *args],
        capture_output=capture,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=900,
    )


def _apply(env: dict[str, Any], arm: str) -> dict[str, Any]:
    """Deploy the arm's inventory through the CLI (the state then knows the config: sync applies
    nothing new) and return what the gateway host really has: the njs dispatch and whether the
    session-less upstream says least_conn (a check that the arm measures what it is named)."""
    res = _cli("gateway", "deploy", env["gw_host"], "-i", env["invs"][arm], "--state-dir", env["state"])
    assert res.returncode == 0, res.stdout + res.stderr
    cmd = (
        "grep -h '^var DISPATCH' /etc/nginx/clusterctl/gateway.js; "
        "grep -c '^    least_conn;' /etc/nginx/clusterctl/gateway.conf; true"
    )
    if arm == "least_score":  # no scores left from an earlier run: every instance starts equal
        cmd = "rm -rf /var/lib/clusterctl-gateway/scores.json /var/lib/clusterctl-gateway/picks/*; " + cmd
    out = env["lab"].run(env["gw_host"], cmd, timeout=30).stdout.split("\n")
    seen = {
        "njs_dispatch": out[0].split('"')[1] if '"' in out[0] else None,
        "least_conn_upstreams": int(out[1]) if len(out) > 1 and out[1].strip().isdigit() else None,
    }
    assert seen["njs_dispatch"] == arm, seen
    assert (seen["least_conn_upstreams"] == 0) == (arm == "round_robin"), seen
    return seen


def _tokens(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(r"^vllm:generation_tokens_total(?:\{[^}]*\})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _in_flight(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(v) for v in re.findall(r"^vllm:num_requests_(?:running|waiting)(?:\{[^}]*\})? (\S+)$", text, re.M))


def _idle(env: dict[str, Any], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while any(_in_flight(u) for u in env["urls"].values()):
        if time.monotonic() > deadline:
            raise RuntimeError("instances still busy")
        time.sleep(1)


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, max(0, round(q / 100 * (len(v) - 1))))]


def closed_loop(gw: str, data: Path, concurrency: int, duration: float) -> dict[str, Any]:
    """``concurrency`` clients, each sending the next dataset row as soon as its last answer ended,
    streamed; rows with a ``session`` carry X-Session-ID (a conversation's next turn).  Counts output
    tokens from the final usage, TTFT at the first content chunk; requests still running at
    ``duration`` finish and count (throughput over the whole wall time)."""
    import http.client
    import itertools
    import threading
    from urllib.parse import urlsplit

    rows = [json.loads(line) for line in data.read_text().splitlines()]
    feed = itertools.cycle(rows)
    lock = threading.Lock()
    host = urlsplit(gw)
    out: dict[str, Any] = {
        "ttft": [],
        "ttft_s": [],
        "e2e": [],
        "tokens": 0,
        "ok": 0,
        "failed": 0,
        "errors": {},
        "homes": {},
        "moves": 0,
    }
    t0 = time.monotonic()

    def client() -> None:
        while time.monotonic() - t0 < duration:
            with lock:
                row = next(feed)
            headers = {"Content-Type": "application/json"}
            if row.get("session"):
                headers["X-Session-ID"] = row["session"]
            body = json.dumps(
                {
                    "model": "qwen3-8b",
                    "prompt": row["prompt"],
                    "max_tokens": row["output_len"],
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
            )
            start = time.monotonic()
            first, tokens, err = None, 0, None
            try:
                conn = http.client.HTTPConnection(host.hostname, host.port, timeout=600)
                conn.request("POST", "/v1/completions", body=body, headers=headers)
                resp = conn.getresponse()
                inst = resp.getheader("X-Gateway-Instance", "")
                if resp.status != 200:
                    err = f"HTTP {resp.status}"
                    resp.read()
                else:
                    for raw in resp:
                        line = raw.decode().strip()
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        d = json.loads(line[6:])
                        if first is None and d.get("choices") and d["choices"][0].get("text"):
                            first = time.monotonic()
                        if d.get("usage"):
                            tokens = int(d["usage"].get("completion_tokens") or 0)
                conn.close()
            except Exception as e:  # noqa: BLE001 - counted
                err = type(e).__name__
            end = time.monotonic()
            with lock:
                if err:
                    out["failed"] += 1
                    out["errors"][err] = out["errors"].get(err, 0) + 1
                    continue
                out["ok"] += 1
                out["tokens"] += tokens
                out["e2e"].append(end - start)
                if first is not None:
                    (out["ttft_s"] if row.get("session") else out["ttft"]).append(first - start)
                if row.get("session"):
                    home = out["homes"].setdefault(row["session"], inst)
                    if home != inst:
                        out["moves"] += 1
                        out["homes"][row["session"]] = inst

    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    allt = out["ttft"] + out["ttft_s"]
    ms = lambda v, q: round(1000 * _pct(v, q), 1)  # noqa: E731
    return {
        "completed": out["ok"],
        "failed": out["failed"],
        "duration_s": wall,
        "errors": out["errors"],
        "output_throughput": out["tokens"] / wall,
        "request_throughput": out["ok"] / wall,
        "ttft_ms": {
            "mean": round(1000 * sum(allt) / max(1, len(allt)), 1),
            "p50": ms(allt, 50),
            "p90": ms(allt, 90),
            "p99": ms(allt, 99),
        },
        "ttft_ms_sessions": {"p50": ms(out["ttft_s"], 50), "p90": ms(out["ttft_s"], 90)},
        "e2e_p99_ms": ms(out["e2e"], 99),
        "session_moves": out["moves"],
    }


def run_arm(
    env: dict[str, Any], arm: str, data: Path, concurrency: int, duration: float, sync_every: float, window: float
) -> dict[str, Any]:
    _idle(env)
    in_config = _apply(env, arm)
    before = {n: _tokens(u) for n, u in env["urls"].items()}
    load0 = os.getloadavg()[0]
    sync = None
    # The same sync loop runs in every arm (a dry run outside least_score: it measures, applies
    # nothing), so each arm pays the same CPU for it on this small machine.
    inv = env["invs"][arm]
    sync = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "clusterctl.cli.main",
            "gateway",
            "sync",
            "-i",
            inv,
            "--state-dir",
            env["state"],
            "--every",
            str(sync_every),
            "--window",
            str(window),
            "--json",
            *([] if arm == "least_score" else ["--dry-run"]),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        res = closed_loop(env["gw"], data, concurrency, duration)
    finally:
        weights: list[dict[str, Any]] = []
        posted = 0
        if sync is not None:
            sync.send_signal(signal.SIGINT)
            try:
                out, _ = sync.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                sync.kill()
                out, _ = sync.communicate()
            for doc in re.split(r"(?m)^(?=\{)", out):
                try:
                    d = json.loads(doc)
                except ValueError:
                    continue
                sc = (d.get("scores") or {}).get("instances", {})
                posted += bool(sc)
                weights.append(
                    {
                        n: (None if s["down"] else sc.get(n, {}).get("load", s["weight"]))
                        for n, s in d["servers"].items()
                    }
                )
    r = res
    assert (posted > 0) == (arm == "least_score"), f"{arm}: {posted} sync rounds posted scores"
    after = {n: _tokens(u) for n, u in env["urls"].items()}
    made = {n: after[n] - before[n] for n in before}
    total = sum(made.values()) or 1.0
    return {
        "arm": arm,
        "completed": r["completed"],
        "failed": r["failed"],
        "duration_s": round(r["duration_s"], 1),
        "output_tokens_per_s": round(r["output_throughput"], 1),
        "requests_per_s": round(r["request_throughput"], 2),
        "ttft_ms": r["ttft_ms"],
        "ttft_ms_sessions": r["ttft_ms_sessions"],
        "e2e_p99_ms": r["e2e_p99_ms"],
        "errors": r["errors"],
        "session_moves": r["session_moves"],
        "token_share": {n: round(v / total, 3) for n, v in sorted(made.items())},
        "in_config": in_config,
        "scores_posted_rounds": posted,
        "scores_or_weights_seen": weights[-3:],
        "sync_rounds": len(weights),
        "load_avg_1m": {"before": round(load0, 2), "after": round(os.getloadavg()[0], 2)},
    }


def main_() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--duration", type=float, default=40.0)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--sync-every", type=float, default=0.5)
    ap.add_argument("--window", type=float, default=1.0)
    ap.add_argument("--arms", default="round_robin,least_conn,least_score")
    ap.add_argument("--profiles", default="mixed", help="mixed (2 h100-sxm + 2 l40s-48g), or one profile for all.")
    ap.add_argument("--keep", action="store_true", help="Leave the instances and nginx running.")
    args = ap.parse_args()
    arms = [a for a in args.arms.split(",") if a]
    lab = LabSession.start(LabConfig.from_env(), hosts=int(os.environ.get("CLUSTERCTL_LAB_HOSTS", "3")))
    results = []
    with tempfile.TemporaryDirectory() as d:
        data = Path(d) / "mixed.jsonl"
        mix = dataset(data, 400)
        env = setup(lab, Path(d), args.time_scale, args.max_num_seqs, args.profiles)
        try:
            for arm in arms:
                results.append(run_arm(env, arm, data, args.concurrency, args.duration, args.sync_every, args.window))
                print(json.dumps(results[-1]), flush=True)
        finally:
            if not args.keep:
                teardown(lab, env)
    # an arm listed twice (``--arms a,b,c,c,b,a``: the machine's load drifts, so each arm runs early
    # and late) is summarised by the mean of its runs
    means: dict[str, dict[str, float]] = {}
    for a in dict.fromkeys(r["arm"] for r in results):
        runs = [r for r in results if r["arm"] == a]
        means[a] = {
            "runs": len(runs),
            "output_tokens_per_s": round(sum(r["output_tokens_per_s"] for r in runs) / len(runs), 1),
            "ttft_p50_ms": round(sum(r["ttft_ms"]["p50"] for r in runs) / len(runs), 1),
            "ttft_p90_ms": round(sum(r["ttft_ms"]["p90"] for r in runs) / len(runs), 1),
            "ttft_p99_ms": round(sum(r["ttft_ms"]["p99"] for r in runs) / len(runs), 1),
            "e2e_p99_ms": round(sum(r["e2e_p99_ms"] for r in runs) / len(runs), 1),
            "failed": sum(r["failed"] for r in runs),
        }
    gain = {}
    if "round_robin" in means:
        base = means["round_robin"]["output_tokens_per_s"] or 1.0
        gain = {a: round(m["output_tokens_per_s"] / base - 1.0, 3) for a, m in means.items() if a != "round_robin"}
    out = {
        "benchmark": "gateway-dispatch",
        "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count()},
        "setup": {
            "gateway": "nginx 1.22 + njs 0.7.9 on a lab host",
            "instances": {
                n: {"profile": profiles(args.profiles)[n], "gpu": g, "port": port}
                for n, (_, g, port, _) in INSTANCES.items()
            },
            "model": "Qwen3-8B (sparse synthetic)",
            "time_scale": args.time_scale,
            "max_num_seqs": args.max_num_seqs,
            "concurrency": args.concurrency,
            "duration_s": args.duration,
            "sync_every_s": args.sync_every,
            "window_s": args.window,
            "workload": mix,
        },
        "arms": results,
        "means": means,
        "output_throughput_gain_vs_round_robin": gain,
    }
    write_result(f"gateway-dispatch-{args.profiles}", out)


def write_result(prefix: str, out: dict[str, Any]) -> None:
    """``benchmarks/results/<prefix>-<UTC date>.json`` (temp file + rename), printed too."""
    dest = REPO / "benchmarks" / "results" / f"{prefix}-{datetime.now(timezone.utc):%Y-%m-%dT%H%M}.json"
    tmp = dest.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=2) + "\n")
    tmp.rename(dest)
    print(json.dumps(out, indent=2))
    print(f"wrote {dest}")


if __name__ == "__main__":
    main_()
