"""``clusterctl doctor`` serving checks on the lab: a hung engine, sustained preemption.

Each test starts the vLLM simulator (part 2: continuous batching, faults) on
one lab host as a transient ``clusterctl-<instance>.service`` unit, as deploy
would name it, with an inventory that declares the instance.  Load comes from
this machine to the instance's lab address only, in a bounded loop (a
deadline and a request cap).  The hang is switched on through the
simulator's loopback-only control endpoint (``POST /sim/fault``), from the
lab host itself.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from clusterctl.cli.main import main
from unit.vllm_sim.promparse import parse
from unit.vllm_sim.test_engine_http import words

MODEL = "/models/qwen3-8b"
#: 64 KV blocks of 16 tokens (1024 tokens) for Qwen3-8B's 147456 bytes per token.
SMALL_KV = str(1024 * 147456)


def instance(host: str, gpu: int, port: int, args: dict) -> dict:
    return {"model": "qwen3-8b", "engine": "vllm-0.11", "placement": f"{host}:[{gpu}]", "port": port, "args": args}


@pytest.fixture(scope="module")
def host(lab) -> str:
    name = lab.names[-1]
    lab.run(
        name, f"test -e {MODEL}/config.json || vllm-sim make-model Qwen3-8B {MODEL} --sparse", check=True, timeout=120
    )
    return name


@pytest.fixture(scope="module")
def inventory(lab, host, tmp_path_factory) -> Path:
    data = yaml.safe_load(Path(lab.inventory).read_text())
    data["models"] = {
        "qwen3-8b": {
            "path": MODEL,
            "arch": {
                "layers": 36,
                "hidden_size": 4096,
                "attention_heads": 32,
                "kv_heads": 8,
                "head_dim": 128,
                "vocab": 151936,
                "params": 8190735360,
                "dtype": "bfloat16",
            },
        }
    }
    data["instances"] = {
        "srv-hang": instance(host, 6, 8110, {"gpu-memory-utilization": 0.5, "max-model-len": 8192}),
        "srv-busy": instance(
            host,
            7,
            8111,
            {"gpu-memory-utilization": 0.5, "max-model-len": 1024, "kv-cache-memory-bytes": int(SMALL_KV)},
        ),
    }
    path = tmp_path_factory.mktemp("doctor-serving") / "inventory.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class Sim:
    """A simulator instance running as ``clusterctl-NAME.service`` on a lab host."""

    def __init__(self, lab, host: str, name: str, gpu: int, port: int, *flags: str, scale: str = "0.2"):
        self.lab, self.host, self.name, self.port = lab, host, name, port
        self.unit = f"clusterctl-{name}.service"
        self.url = f"http://{lab.host(host).address}:{port}"
        lab.run(host, f"systemctl stop {self.unit} 2>/dev/null; systemctl reset-failed {self.unit} 2>/dev/null")
        lab.run(
            host,
            f"systemd-run --unit {self.unit} --setenv=CUDA_VISIBLE_DEVICES={gpu} "
            f"--setenv=VLLM_SIM_TIME_SCALE={scale} --setenv=VLLM_SIM_STARTUP_SCALE=0 "  # serving slow, started at once
            "--setenv=VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS=3000 "
            f"/opt/vllm-0.11/bin/vllm serve {MODEL} --port {port} --served-model-name qwen3-8b " + " ".join(flags),
            check=True,
        )

    def wait_ready(self, within: float = 120) -> None:
        deadline = time.monotonic() + within
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (OSError, urllib.error.URLError):
                pass
            journal = self.lab.run(self.host, f"journalctl -u {self.unit} --no-pager | tail -20").stdout
            assert time.monotonic() < deadline, journal
            time.sleep(0.5)

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
            return sum(parse(r.read().decode()).get(name, {}).values())

    def fault(self, body: dict) -> dict:
        """``POST /sim/fault`` from the lab host itself (the endpoint answers loopback only)."""
        script = (
            "import json,sys,urllib.request as u; r=u.urlopen(u.Request(sys.argv[1], data=sys.argv[2].encode(),"
            " headers={'Content-Type': 'application/json'}), timeout=5); print(r.read().decode())"
        )
        p = self.lab.run(
            self.host,
            f"python3 -c \"{script}\" http://127.0.0.1:{self.port}/sim/fault '{json.dumps(body)}'",
            check=True,
        )
        return json.loads(p.stdout)

    def health_on_host(self) -> int:
        p = self.lab.run(
            self.host,
            "python3 -c \"import urllib.request as u; "
            f"print(u.urlopen('http://127.0.0.1:{self.port}/health', timeout=5).status)\"",
        )
        return int(p.stdout.strip() or 0)

    def stop(self) -> None:
        self.lab.run(self.host, f"systemctl stop {self.unit}; systemctl reset-failed {self.unit} 2>/dev/null")


class Load:
    """``clients`` threads posting completions to one instance until stopped, at
    most ``cap`` requests in all and never past ``seconds``."""

    def __init__(
        self,
        url: str,
        clients: int,
        prompt_words: int,
        max_tokens: int,
        *,
        seconds: float = 90,
        cap: int = 400,
        timeout: float = 60,
    ):
        self.url, self.sent, self.errors = url + "/v1/completions", 0, 0
        self.stop_at = time.monotonic() + seconds
        self.cap, self.lock, self.done = cap, threading.Lock(), threading.Event()
        self.threads = [
            threading.Thread(target=self._client, args=(i, prompt_words, max_tokens, timeout), daemon=True)
            for i in range(clients)
        ]
        for t in self.threads:
            t.start()

    def _client(self, i: int, prompt_words: int, max_tokens: int, timeout: float) -> None:
        k = 0
        while not self.done.is_set() and time.monotonic() < self.stop_at:
            with self.lock:
                if self.sent >= self.cap:
                    return
                self.sent += 1
            prompt = words(f"c{i}r{k}", prompt_words)
            body = json.dumps(
                {"model": "qwen3-8b", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
            ).encode()
            req = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=timeout) as r:
                    r.read()
            except (OSError, urllib.error.URLError):
                with self.lock:
                    self.errors += 1
                time.sleep(0.2)
            k += 1

    def close(self) -> None:
        self.done.set()


@pytest.fixture
def started(lab, host) -> Iterator[list]:
    """Simulators and loads of one test, stopped whatever the outcome."""
    things: list = []
    yield things
    for t in things:
        t.close() if isinstance(t, Load) else t.stop()


def doctor(inventory: Path, capsys) -> tuple[int, dict]:
    rc = main(["doctor", "all", "-i", str(inventory), "--json", "--checks", "serving", "--interval", "1", "--sudo"])
    return rc, json.loads(capsys.readouterr().out)


def serving(rep: dict, name: str, check: str = "serving.metrics") -> list[dict]:
    return [f for f in rep["findings"] if f["check"] == check and f["subject"] == f"instance:{name}"]


def test_hung_engine_is_critical_with_the_restart_action(lab, host, inventory, capsys, started):
    sim = Sim(lab, host, "srv-hang", 6, 8110, "--gpu-memory-utilization", "0.5", "--max-model-len", "8192")
    started.append(sim)
    sim.wait_ready()
    load = Load(sim.url, clients=3, prompt_words=50, max_tokens=4000, seconds=120, cap=30, timeout=100)
    started.append(load)
    deadline = time.monotonic() + 30
    while sim.metric("vllm:num_requests_running") < 1 or sim.metric("vllm:generation_tokens_total") < 1:
        assert time.monotonic() < deadline, "no request started"
        time.sleep(0.2)

    rc, rep = doctor(inventory, capsys)  # serving, tokens moving: not hung
    before = serving(rep, "srv-hang")
    assert [f["severity"] for f in before] == ["OK"], before

    assert sim.fault({"fault": "hang"})["hang"] is True
    time.sleep(0.5)  # the step in flight ends; the next never does
    rc, rep = doctor(inventory, capsys)
    assert sim.health_on_host() == 200  # /health cannot see it
    hung = [f for f in serving(rep, "srv-hang") if f["message"].startswith("engine hung")]
    assert len(hung) == 1 and hung[0]["severity"] == "CRIT" and hung[0]["host"] == host, serving(rep, "srv-hang")
    assert hung[0]["action"].startswith("restart the instance")
    assert "requests running but no token generated" in hung[0]["message"]
    assert rc == 2


def test_sustained_preemption_under_load_is_reported(lab, host, inventory, capsys, started):
    sim = Sim(
        lab,
        host,
        "srv-busy",
        7,
        8111,
        "--gpu-memory-utilization",
        "0.5",
        "--max-model-len",
        "1024",
        "--kv-cache-memory-bytes",
        SMALL_KV,
    )
    started.append(sim)
    sim.wait_ready()
    # eight clients whose sequences grow to 400 tokens: 3200 tokens wanted, 1024 in the KV cache
    load = Load(sim.url, clients=8, prompt_words=100, max_tokens=300, seconds=90, cap=300)
    started.append(load)
    deadline = time.monotonic() + 45
    first = sim.metric("vllm:num_preemptions_total")
    while sim.metric("vllm:num_preemptions_total") < first + 3:
        assert time.monotonic() < deadline, "no preemption under load"
        time.sleep(0.3)

    rc, rep = doctor(inventory, capsys)
    found = serving(rep, "srv-busy")
    rising = [f for f in found if f["message"].startswith("preemptions rising")]
    assert len(rising) == 1 and rising[0]["severity"] == "WARN" and rising[0]["host"] == host, found
    assert "--gpu-memory-utilization" in rising[0]["action"] and "--max-num-seqs" in rising[0]["action"]
    assert not [f for f in found if f["message"].startswith("engine hung")]  # busy, not hung
    assert rc in (1, 2)  # WARN at least (KV pinned full may add a CRIT)
    assert load.sent <= 300
