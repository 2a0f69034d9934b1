"""A load ramp against an autoscaled template behind the real gateway, on the lab (simulator instances).

Shared by the lab test (tests/lab/test_autoscale.py, short) and the benchmark
(benchmarks/autoscale/ramp.py, longer, writes results and a plot):

* nginx on the lab's first host (``auth: none``), a template of TP-1 replicas of
  the tiny model on the second host, ``--max-num-seqs`` small and the
  simulator's time scale above 0 so one replica queues under a few requests
  per second;
* the autoscaler as its daemon (``clusterctl autoscale daemon --interval 1``),
  signal ``queue``;
* phases of ``clusterctl bench GATEWAY --request-rate R --duration S`` one after
  the other (the ramp), each one's JSON kept (completed and failed counts).

Only ``clusterctl-<template>-*`` units, the model directory and nginx are
touched, all removed by :meth:`Ramp.cleanup`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from support.deploy_lab import remove_deployed, tiny_entry, tiny_model

REPO = Path(__file__).resolve().parents[2]
GW_PORT = 8080


class Ramp:
    def __init__(
        self,
        lab: Any,
        root: Path,
        *,
        name: str = "asr",
        time_scale: float = 5.0,
        max_num_seqs: int = 2,
        policy: dict[str, Any] | None = None,
        port_base: int = 8900,
        real: bool = False,
        startup_scale: float | None = None,
    ) -> None:
        """``real``: replicas of the real vLLM CPU engine (the tiny real model, one per host's CPU slot, on
        every lab host) instead of simulator replicas on the second host.  ``startup_scale``: the
        simulator's start-up delays at this scale instead of ``time_scale`` ($VLLM_SIM_STARTUP_SCALE)."""
        self.lab, self.root, self.name, self.real = lab, root, name, real
        self.inv_path, self.state_dir = root / "inventory.yaml", root / "state"
        self.gw_host, self.worker = lab.names[0], lab.names[1]
        self.workers = list(lab.names) if real else [self.worker]
        doc = yaml.safe_load(Path(lab.inventory).read_text())
        if real:
            from clusterctl.lab import realmodel

            model = realmodel.model_dir()
            assert model is not None, "the tiny real model is not there (scripts/install-real-vllm)"
            doc["models"] = {
                f"{name}-tiny": {
                    "path": f"/models/{name}-tiny",
                    "source": str(model),
                    "version": "v1",
                    "served_name": f"{name}-tiny",
                    "arch": realmodel.arch_entry(),
                }
            }
        else:
            doc["models"] = {
                f"{name}-tiny": tiny_entry(tiny_model(root), f"/models/{name}-tiny", served_name=f"{name}-tiny")
            }
        doc.pop("instances", None)
        doc["gateway"] = {"hosts": self.gw_host, "port": GW_PORT, "sync_interval_s": 1, "auth": "none"}
        self.policy = {
            "min": 1,
            "max": 2,
            "signal": "queue",
            "high": 1.5,
            "low": 0.3,
            "window_s": 1,
            "scale_out_after_s": 2,
            "scale_in_after_s": 8,
            "cooldown_out_s": 3,
            "cooldown_in_s": 8,
            "max_step": 1,
            "interval_s": 1,
            "gate_timeout_s": 90,
            "drain_timeout_s": 120,
            **(policy or {}),
        }
        doc["templates"] = {
            name: {
                "model": f"{name}-tiny",
                "engine": "vllm-0.11",
                "replicas": 1,
                "tp": 1,
                "hosts": self.worker,
                "port_base": port_base,
                "args": {
                    "max-model-len": 2048,
                    "max-num-seqs": max_num_seqs,
                    "enforce-eager": True,
                },  # start-up ~10 s x scale
                "env": {
                    "VLLM_SIM_TIME_SCALE": str(time_scale),
                    **({} if startup_scale is None else {"VLLM_SIM_STARTUP_SCALE": str(startup_scale)}),
                },
                "autoscale": self.policy,
            }
        }
        if real:
            from clusterctl.lab import realvllm

            # One OpenMP thread, not bound (two replicas share the machine's cores), the CPU slot of each host.
            doc["templates"][name].update(
                engine=realvllm.ENGINE,
                hosts=",".join(self.workers),
                args={"max-model-len": 2048, "kv-cache-memory-bytes": "64M", "max-num-seqs": max_num_seqs},
                env={
                    "OMP_NUM_THREADS": "1",
                    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                    "VLLM_NO_USAGE_STATS": "1",
                    "HF_HUB_OFFLINE": "1",
                    "TOKENIZERS_PARALLELISM": "false",
                },
            )
        self.inv_path.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.url = f"http://{lab.host(self.gw_host).address}:{GW_PORT}"
        self.env = {**os.environ, "PYTHONPATH": str(REPO), "CLUSTERCTL_STATE_DIR": str(self.state_dir)}
        self.daemon: subprocess.Popen[str] | None = None
        self.output_len = 200  # ~1.3 s a request at time scale 5: one replica (2 seats) serves ~1.5 req/s

    def cli(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "clusterctl.cli.main", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
        )

    def ok(self, *args: str) -> subprocess.CompletedProcess[str]:
        res = self.cli(*args, "-i", str(self.inv_path), "--state-dir", str(self.state_dir))
        assert res.returncode == 0, f"{args}: rc {res.returncode}\n{res.stdout[-3000:]}{res.stderr[-3000:]}"
        return res

    def start(self) -> None:
        """Deploy the template (min replicas) and the gateway."""
        self.ok("deploy", "--instances", f"{self.name}-*", "--gate-timeout", str(self.policy["gate_timeout_s"]))
        self.ok("gateway", "deploy", self.gw_host)

    def start_daemon(self) -> None:
        log = open(self.root / "daemon.log", "w")
        self.daemon = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "clusterctl.cli.main",
                "autoscale",
                "daemon",
                "--interval",
                "1",
                "-i",
                str(self.inv_path),
                "--state-dir",
                str(self.state_dir),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            text=True,
        )

    def stop_daemon(self) -> int | None:
        if self.daemon is None:
            return None
        self.daemon.send_signal(signal.SIGTERM)  # the round in progress finishes first
        try:
            rc = self.daemon.wait(timeout=240)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            rc = self.daemon.wait(timeout=30)
        self.daemon = None
        return rc

    def bench(
        self, rate: float, duration: float, concurrency: int = 64, output_len: int | None = None
    ) -> dict[str, Any]:
        """One phase through the gateway; the bench's JSON (rc 3 = its timing was not trusted on a busy
        machine: the counts still hold) with ``started``/``ended`` (epoch) added."""
        t0 = time.time()
        res = self.cli(
            "bench",
            self.url,
            "--concurrency",
            str(concurrency),
            "--request-rate",
            str(rate),
            "--duration",
            str(duration),
            "--input-len",
            "32",
            "--output-len",
            str(output_len or self.output_len),
            "--no-tokenizer",
            "--no-server-timings",
            "--model",
            f"{self.name}-tiny",
            "--timeout",
            "300",
            "--json",
            timeout=duration + 400,
        )
        assert res.returncode in (0, 1, 2, 3), res.stdout[-2000:] + res.stderr[-2000:]
        out = json.loads(res.stdout)
        out.update(started=t0, ended=time.time(), rc=res.returncode)
        return out

    def history(self) -> list[dict[str, Any]]:
        path = self.state_dir / "autoscale" / "history.jsonl"
        if not path.exists():
            return []
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]

    def wait_for(self, action: str, since: float, timeout: float) -> dict[str, Any] | None:
        """The first decision of ``action`` carried out (outcome ok) after ``since``, waiting up to ``timeout``."""
        end = time.time() + timeout
        while True:
            got = [h for h in self.history() if h["action"] == action and h["outcome"] == "ok" and h["ts"] >= since]
            if got or time.time() > end:
                return got[0] if got else None
            time.sleep(1)

    def units(self) -> list[str]:
        out = []
        for host in self.workers:
            text = self.lab.run(
                host, f"systemctl list-units --no-legend --state=active 'clusterctl-{self.name}-*.service'"
            ).stdout
            out += [
                line.split()[0][len("clusterctl-") : -len(".service")] for line in text.splitlines() if line.strip()
            ]
        return sorted(out)

    def cleanup(self) -> None:
        self.stop_daemon()
        n = self.name
        remove_deployed(
            self.lab,
            f"clusterctl-{n}-*.service",
            f"/etc/clusterctl/instances/{n}-*.env "
            f"/var/lib/clusterctl/deploy/previous/{n}-* /models/{n}-tiny /models/.versions/{n}-tiny",
            hosts=self.workers,
        )
        self.lab.run(self.gw_host, "systemctl disable --now nginx.service", timeout=60)
