"""Whole-host loss of the active gateway host: failed requests, the gap, streams cut.

On the lab: two gateway hosts (nginx + keepalived, unicast VRRP, ``gateway.vip``) on the
first two lab hosts, two simulator instances (``h100-sxm`` latency profile, time scale 1.0) on
the second and third.  Clients use the floating address:

* a prober sends short completions one after another (``--probe-timeout``, 1.5 s, each);
* ``--streams`` clients each stream long completions (``--stream-tokens`` tokens,
  ``--stream-timeout`` read timeout, 8 s) one after another.

After ``--warm`` seconds the host holding the address is taken off the network as a power loss
looks from outside (the lab's ``cut`` fault, as ``clusterctl lab inject HOST cut``, called in
this process so the moment is known: its bridge port goes down, so no packet,
ARP answer, FIN or RST comes from it again; the lab's hosts are nspawn containers on one kernel,
so this stands in for ``poweroff``).  The other host stops hearing VRRP adverts and takes the
address.  Measured: the gap from the cut to the first new request answered, the prober's
failures, the streams in flight at the cut and what became of them (finished, or cut: no more
bytes, ended by the read timeout), the streams started after the gap, and the 1-minute load
average.  Then the host is healed, and where the address ends up is recorded (the healed host
comes back with keepalived still running: the higher priority may take the address back).

Run as root with the lab's environment (``CLUSTERCTL_LAB_*``, 3 hosts; brought up if needed and
left up).  Usage: ``python benchmarks/gateway/host_loss.py [--gateway-only | --with-instance]
[--dispatch least_score] [--streams 6] [--stream-tokens 600]
[--warm 6] [--after 15] [--probe-timeout 1.5] [--stream-timeout 8]``.  Writes ``benchmarks/results/gateway-host-loss-<date>.json`` (temp
file + rename).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import dispatch  # noqa: E402  (the dispatch benchmark's lab setup: units, inventory, gateway deploy)

from clusterctl.gateway.render import CONNECT_TIMEOUT_S  # noqa: E402
from clusterctl.lab import netfaults  # noqa: E402


def _cli_json(*args: str) -> tuple[int, Any]:
    res = dispatch._cli(*args)
    try:
        return res.returncode, json.loads(res.stdout)
    except ValueError:
        return res.returncode, None


def holders(args: list[str]) -> list[str]:
    rc, doc = _cli_json("gateway", "status", *args, "--json")
    return list(((doc or {}).get("vip") or {}).get("holders") or [])


def wait_one_holder(args: list[str], timeout: float = 60.0) -> list[str]:
    deadline = time.monotonic() + timeout
    h: list[str] = []
    while time.monotonic() < deadline:
        h = holders(args)
        if len(h) == 1:
            return h
        time.sleep(0.5)
    return h


def prober(host: str, port: int, stop: threading.Event, log: list[dict[str, Any]], timeout: float) -> None:
    body = json.dumps({"model": "qwen3-8b", "prompt": "hello there", "max_tokens": 2})
    while not stop.is_set():
        t0 = time.monotonic()
        ok, err = False, None
        try:
            c = http.client.HTTPConnection(host, port, timeout=timeout)
            c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            ok = r.status == 200 and bool(json.loads(r.read()).get("choices"))
            err = None if ok else f"HTTP {r.status}"
            c.close()
        except Exception as e:  # noqa: BLE001 - a refused or cut request is what is counted
            err = type(e).__name__
        log.append({"sent": t0, "done": time.monotonic(), "ok": ok, "error": err})
        if not ok:
            time.sleep(0.05)


def streamer(
    host: str, port: int, tokens: int, stop: threading.Event, log: list[dict[str, Any]], timeout: float
) -> None:
    body = json.dumps(
        {
            "model": "qwen3-8b",
            "prompt": "tell me a long story " * 8,
            "max_tokens": tokens,
            "ignore_eos": True,
            "stream": True,
        }
    )
    while not stop.is_set():
        rec: dict[str, Any] = {"sent": time.monotonic(), "chunks": 0, "done": False, "error": None, "last_byte": None}
        try:
            c = http.client.HTTPConnection(host, port, timeout=timeout)
            c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status != 200:
                rec["error"] = f"HTTP {r.status}"
                r.read()
            else:
                for raw in r:
                    rec["last_byte"] = time.monotonic()
                    line = raw.decode().strip()
                    if line == "data: [DONE]":
                        rec["done"] = True
                    elif line.startswith("data: "):
                        rec["chunks"] += 1
            c.close()
        except Exception as e:  # noqa: BLE001 - counted
            rec["error"] = type(e).__name__
        rec["ended"] = time.monotonic()
        log.append(rec)
        if rec["error"]:
            time.sleep(0.2)


def main_() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--streams", type=int, default=6)
    ap.add_argument("--stream-tokens", type=int, default=600)
    ap.add_argument("--warm", type=float, default=6.0)
    ap.add_argument("--after", type=float, default=15.0, help="Seconds of load after the first answer past the cut.")
    ap.add_argument(
        "--gateway-only",
        action="store_true",
        help="Lose the gateway host that serves no instance (the address is moved there first).",
    )
    ap.add_argument(
        "--with-instance",
        action="store_true",
        help="Lose the gateway host that also serves an instance (the address is moved there first).",
    )
    ap.add_argument("--probe-timeout", type=float, default=1.5, help="The prober's timeout per request (s).")
    ap.add_argument(
        "--stream-timeout", type=float, default=8.0, help="A stream's read timeout (s): a cut stream ends so."
    )
    ap.add_argument(
        "--dispatch",
        default="least_score",
        choices=dispatch.ARMS,
        help="The gateway's dispatch (least_score is the default; the first runs used least_conn).",
    )
    args = ap.parse_args()
    # two instances: one on each of the second and third lab hosts
    dispatch.INSTANCES.clear()
    dispatch.INSTANCES.update({"hl1-0": (1, 0, 8301, "h100-sxm"), "hl2-0": (2, 0, 8301, "h100-sxm")})
    lab = dispatch.LabSession.start(dispatch.LabConfig.from_env(), hosts=3)
    names = lab.names
    pair = [names[0], names[1]]
    a, b = lab.host(names[0]).address.split(".")[:2]
    vip = f"{a}.{b}.250.{200 + int(lab.host(names[0]).address.split('.')[-1]) % 50}"
    os.environ["GW_BENCH_VRRP_PASS"] = "bEnch-v1"
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        env = dispatch.setup(lab, Path(d), 1.0, 8, "h100-sxm")
        inv = Path(d) / "inventory-ha.yaml"
        inv.write_text(
            Path(env["invs"][args.dispatch])
            .read_text()
            .replace(
                f"gateway:\n  hosts: {names[0]}\n",
                f"gateway:\n  hosts: [{', '.join(pair)}]\n  vip: {{address: {vip}/16, interface: eth0, router_id: 78, "
                "password: {env: GW_BENCH_VRRP_PASS}}\n",
            )
        )
        cli = ["-i", str(inv), "--state-dir", env["state"]]
        cut: str | None = None
        try:
            res = dispatch._cli("gateway", "deploy", "all", *cli)
            assert res.returncode == 0, res.stdout + res.stderr
            hs = wait_one_holder(cli)
            assert len(hs) == 1, f"no single holder of the floating address: {hs}"
            active = hs[0]
            # --gateway-only: lose the first host (no instance); --with-instance: the second (one instance)
            want = names[0] if args.gateway_only else names[1] if args.with_instance else active
            if active != want:  # move the address first
                lab.run(active, "systemctl restart keepalived.service", check=True, timeout=60)
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline and hs != [want]:
                    time.sleep(0.5)
                    hs = holders(cli)
                assert hs == [want], f"the address did not move to {want}: {hs}"
                active = hs[0]
            stop = threading.Event()
            plog: list[dict[str, Any]] = []
            slog: list[dict[str, Any]] = []
            threads = [
                threading.Thread(
                    target=prober, args=(vip, dispatch.GW_PORT, stop, plog, args.probe_timeout), daemon=True
                )
            ]
            threads += [
                threading.Thread(
                    target=streamer,
                    args=(vip, dispatch.GW_PORT, args.stream_tokens, stop, slog, args.stream_timeout),
                    daemon=True,
                )
                for _ in range(args.streams)
            ]
            load0 = os.getloadavg()[0]
            for t in threads:
                t.start()
            time.sleep(args.warm)
            # in this process (one `ip link set down`): the moment of the loss is known to a few ms
            t0 = time.monotonic()
            netfaults.cut(lab.cfg, lab.host(active))
            t_cut = time.monotonic()
            cut = active
            deadline = time.monotonic() + 60
            first_ok = None
            while time.monotonic() < deadline and first_ok is None:
                first_ok = next((e for e in plog if e["ok"] and e["sent"] > t_cut), None)
                time.sleep(0.1)
            time.sleep(args.after)
            stop.set()
            for t in threads:
                t.join(40)
            load1 = os.getloadavg()[0]
            after = [e for e in plog if e["done"] >= t_cut]
            failed = [e for e in after if not e["ok"]]
            in_flight = [s for s in slog if s["sent"] < t_cut <= s["ended"]]
            later = [s for s in slog if first_ok is not None and s["sent"] >= first_ok["done"]]
            holder_after = holders(cli)
            out = {
                "benchmark": "gateway-host-loss",
                "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "machine": {"cpus": os.cpu_count()},
                "setup": {
                    "gateway_hosts": pair,
                    "vip": vip,
                    "advert_s": 1,
                    "instances": 2,
                    "profile": "h100-sxm",
                    "time_scale": 1.0,
                    "streams": args.streams,
                    "stream_tokens": args.stream_tokens,
                    "probe_timeout_s": args.probe_timeout,
                    "stream_timeout_s": args.stream_timeout,
                    "lost_host_also_serves_an_instance": active == names[1],
                    "dispatch": args.dispatch,
                    "proxy_connect_timeout_s": CONNECT_TIMEOUT_S,
                    "loss": "the lab cut fault: the bridge port down",
                },
                "lost_host": active,
                "cut_call_s": round(t_cut - t0, 3),
                "gap_s": None if first_ok is None else round(first_ok["done"] - t_cut, 2),
                "first_new_request_sent_after_cut_s": None if first_ok is None else round(first_ok["sent"] - t_cut, 2),
                "prober": {
                    "requests": len(plog),
                    "after_cut": len(after),
                    "failed_after_cut": len(failed),
                    "errors": sorted({str(e["error"]) for e in failed}),
                    "failed_after_gap": sum(
                        1 for e in after if not e["ok"] and first_ok is not None and e["sent"] > first_ok["done"]
                    ),
                },
                "streams_in_flight_at_cut": len(in_flight),
                "streams_in_flight_finished": sum(1 for s in in_flight if s["done"]),
                "streams_in_flight_cut": sum(1 for s in in_flight if not s["done"]),
                "stream_cut_errors": sorted({str(s["error"]) for s in in_flight if not s["done"]}),
                "streams_started_after_gap": len(later),
                "streams_started_after_gap_ok": sum(1 for s in later if s["done"]),
                "streams_started_after_gap_unfinished_at_stop": sum(
                    1 for s in later if not s["done"] and not s["error"]
                ),
                "holders_after_loss": holder_after,
                "load_avg_1m": {"before": round(load0, 2), "after": round(load1, 2)},
            }
        finally:
            if cut:
                netfaults.heal(lab.cfg, lab.host(cut))
                time.sleep(6)
                if out:
                    out["holders_after_heal"] = holders(cli)
            for h in pair:
                lab.run(
                    h,
                    "systemctl disable --now keepalived.service; "
                    "rm -f /etc/keepalived/keepalived.conf /etc/keepalived/clusterctl-check-nginx",
                    timeout=60,
                )
            dispatch.teardown(lab, env)
    if not out:
        raise SystemExit("no measurement")
    dispatch.write_result("gateway-host-loss", out)


if __name__ == "__main__":
    main_()
