"""Start a vLLM engine on loopback: the simulator (0.11, 0.33) or the real CPU engine (0.32).

One interface for both, so the conformance suite (tests/real) runs the same
assertions against each.  The real engine busy-polls its cores, so it is pinned
to one core with one OpenMP thread, and every process group started here is
killed at the end of the test that started it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterctl.diagnose.serving import parse_metrics, total
from clusterctl.lab import realvllm
from clusterctl.lab.vllm_sim.serve import free_port

READY = "Application startup complete."
#: The core the real engine is pinned to (the second one: the first carries the shell and pytest).
REAL_CORE = os.environ.get("CLUSTERCTL_REAL_VLLM_CORE", str(max(0, (os.cpu_count() or 1) - 1)))
#: CPU engine settings every real start passes (the unit template adds the same, see deploy/units).
REAL_FLAGS = ("--enforce-eager", "--dtype", "bfloat16")
REAL_KV = str(64 * 2**20)


@dataclass
class EngineProc:
    """A running ``vllm serve`` (either kind): output captured, HTTP helpers."""

    kind: str  # "sim-0.11", "sim-0.33", "real-0.32"
    proc: subprocess.Popen[str]
    port: int
    lines: list[str] = field(default_factory=list)
    _reader: threading.Thread | None = None

    @property
    def real(self) -> bool:
        return self.kind.startswith("real")

    @property
    def version(self) -> str:
        return self.kind.split("-", 1)[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, timeout: float = 180.0) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if text in self.log:
                return True
            if self.proc.poll() is not None and (self._reader is None or not self._reader.is_alive()):
                return text in self.log
            time.sleep(0.05)
        return False

    def wait(self, timeout: float = 60.0) -> int:
        rc = self.proc.wait(timeout)
        if self._reader:
            self._reader.join(5)
        return rc

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.wait(60)
        finally:
            self.kill()

    def kill(self) -> None:
        """SIGKILL whatever is left of the process group (engine core children included)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.proc.poll() is None:
            self.proc.wait(10)

    def children(self) -> list[int]:
        """Pids of the server's child processes (the real engine core runs in one)."""
        try:
            out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        except OSError:
            return []
        return [int(p) for p in out.split()]

    def request(
        self, path: str, body: Any = None, headers: dict[str, str] | None = None, timeout: float = 120
    ) -> tuple[int, bytes]:
        req = urllib.request.Request(
            self.url + path,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def get(self, path: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        return self.request(path, None, headers)

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        return self.request(path, body, headers)


def _spawn(kind: str, argv: list[str], env: dict[str, str], port: int) -> EngineProc:
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    ep = EngineProc(kind, proc, port)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            ep.lines.append(line)

    ep._reader = threading.Thread(target=read, daemon=True)
    ep._reader.start()
    return ep


def real_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a real CPU engine runs with here: one core, one thread, no telemetry."""
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        VLLM_CPU_OMP_THREADS_BIND=REAL_CORE,
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        TORCH_COMPILE_DISABLE="1",
    )
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # it would override --kv-cache-memory-bytes
    env.pop("VLLM_API_KEY", None)
    env.update(extra or {})
    return env


def start_engine(
    kind: str,
    model: Path,
    *flags: str,
    env: dict[str, str] | None = None,
    nvml_lib: Path | None = None,
    nvml_state: Path | None = None,
    kv_bytes: str | None = REAL_KV,
) -> EngineProc:
    """Start ``vllm serve MODEL`` of ``kind`` on 127.0.0.1 (a free port) with ``flags``.

    The real engine gets ``--kv-cache-memory-bytes`` (``kv_bytes``; None: leave it to
    vLLM) and :data:`REAL_FLAGS`; the simulator runs on the fake-NVML host given
    (``nvml_lib``/``nvml_state``) at time scale 0.
    """
    port = free_port()
    common = ["--host", "127.0.0.1", "--port", str(port)]
    if kind.startswith("real"):
        eng = realvllm.installed()
        if eng is None:
            raise RuntimeError("the real vLLM engine is not installed (scripts/install-real-vllm)")
        kv = ["--kv-cache-memory-bytes", kv_bytes] if kv_bytes else []
        argv = ["taskset", "-c", REAL_CORE, str(eng.vllm), "serve", str(model), *common, *REAL_FLAGS, *kv, *flags]
        return _spawn(kind, argv, real_env(env), port)
    version = kind.split("-", 1)[1]
    e = dict(os.environ, VLLM_SIM_VERSION=version, VLLM_SIM_TIME_SCALE="0", CUDA_VISIBLE_DEVICES="0")
    e.update(env or {})
    if "VLLM_API_KEY" not in (env or {}):
        e.pop("VLLM_API_KEY", None)
    if nvml_lib is not None:
        e["LD_LIBRARY_PATH"] = str(nvml_lib)
    if nvml_state is not None:
        e["FAKE_NVML_STATE"] = str(nvml_state)
    argv = [sys.executable, "-m", "clusterctl.lab.vllm_sim", "serve", str(model), *common, *flags]
    return _spawn(kind, argv, e, port)


# ---- a burst of streams (the preemption check and its benchmark) ---------------------------------------

#: Words the burst's prompts are made of (any text the tiny model's tokenizer splits into many tokens).
_BURST_WORDS = (
    "the cluster serves each request from a rack of nodes and every stream keeps its own cache "
    "while the scheduler admits waiting work when blocks are free"
).split()


def burst_prompts(model: Path, n: int, tokens: int, salt: str = "") -> list[str]:
    """``n`` distinct prompts of exactly ``tokens`` tokens by ``model``'s own tokenizer (no shared prefix
    blocks, so prefix caching saves nothing; a new ``salt`` for each burst on one engine)."""
    from clusterctl.lab.vllm_sim import bpe

    encode = bpe.load(model)
    assert encode is not None, f"{model}: not a byte-level BPE tokenizer"
    cost: dict[str, int] = {}  # tokens of " word" (the pre-tokenizer splits before each space-led word)
    out = []
    for i in range(n):
        words, k = [f"{salt}stream{i}:"], i
        count = len(encode(words[0]))
        while count < tokens:
            w = _BURST_WORDS[k % len(_BURST_WORDS)]
            k += 7
            count += cost.setdefault(w, len(encode(" " + w)))
            words.append(w)
        text = " ".join(words)
        while len(encode(text)) > tokens:
            words.pop()
            text = " ".join(words)
        while len(encode(text)) < tokens:
            text += "."
        out.append(text)
    return out


def burst(
    ep: EngineProc,
    prompts: list[str],
    max_tokens: int,
    model: str = "tiny",
    headers: dict[str, str] | None = None,
    timeout: float = 300,
) -> list[dict[str, Any]]:
    """Send every prompt at once as a streaming completion (``ignore_eos``); per request: HTTP status,
    tokens received, finish reason, usage.  A stream cut short shows as fewer tokens or no finish reason."""
    results: list[dict[str, Any]] = [{} for _ in prompts]
    gate = threading.Barrier(len(prompts))

    def one(i: int) -> None:
        body = {
            "model": model,
            "prompt": prompts[i],
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        req = urllib.request.Request(
            ep.url + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        r: dict[str, Any] = {"status": None, "tokens": 0, "finish_reason": None, "usage": None}
        gate.wait()
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                r["status"] = resp.status
                for raw in resp:
                    line = raw.decode().strip()
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[len("data: ") :])
                    for ch in chunk.get("choices") or []:
                        r["tokens"] += 1 if ch.get("text") is not None else 0
                        r["finish_reason"] = ch.get("finish_reason") or r["finish_reason"]
                    r["usage"] = chunk.get("usage") or r["usage"]
        except urllib.error.HTTPError as e:
            r["status"] = e.code
        except OSError as e:
            r["error"] = str(e)
        results[i] = r

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 10)
    return results


def preemptions_total(ep: EngineProc, headers: dict[str, str] | None = None) -> float:
    """vllm:num_preemptions_total (all label sets) from the engine's /metrics."""
    status, body = ep.get("/metrics", headers)
    assert status == 200, status
    return preemptions_in(body.decode())


def preemptions_in(metrics_text: str) -> float:
    """vllm:num_preemptions_total summed over label sets, read by the doctor's own /metrics parser (0 when
    the engine has not exported it yet)."""
    return total(parse_metrics(metrics_text), "vllm:num_preemptions_total") or 0.0
