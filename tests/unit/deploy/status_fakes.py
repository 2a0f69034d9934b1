"""Fakes for status/drain tests: a vLLM-like HTTP server on 127.0.0.1 and a host's deploy read.

``FakeVllm`` answers ``/health``, ``/version`` and ``/metrics`` (recorded
simulator texts from tests/fixtures/deploy/status, served in turn) over a
real socket, so the status code's HTTP path, timeouts included, is the real
one.  ``fleet_for`` is a Fleet whose fake transport answers the deploy node
program's ``read`` with the given units and ``cat /proc/uptime``.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import pytest

from clusterctl.fleet.fleet import Fleet
from clusterctl.fleet.transport import FakeReply, FakeTransport, HostFailure
from clusterctl.fleet.results import HostStatus
from clusterctl.inventory.model import Engine, GpuRef, Host, Instance, Inventory, Model

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "deploy" / "status"
UPTIME_S = 5000.0


def recorded(name: str) -> str:
    return (FIXTURES / name).read_text()


def metrics_text(running: int, waiting: int, kv: float = 0.0, generated: int = 0) -> str:
    """A minimal /metrics body in vLLM's names."""
    lab = '{engine="0",model_name="m"}'
    return (
        f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{lab} {running}.0\n"
        f"vllm:num_requests_waiting{lab} {waiting}.0\nvllm:kv_cache_usage_perc{lab} {kv}\n"
        f"vllm:generation_tokens_total{lab} {generated}.0\n"
    )


class FakeVllm:
    """``health``: status for /health (0: close the connection without answering is not
    modelled; stop the server for a refused connection).  ``metrics``: texts served
    in turn, the last one repeated; or ``metrics_fn`` called per request."""

    def __init__(
        self,
        metrics: list[str] | None = None,
        version: str = "0.11.0",
        health: int = 200,
        metrics_fn: Callable[[], str] | None = None,
    ):
        self.metrics = list(metrics or [metrics_text(0, 0)])
        self.metrics_fn = metrics_fn
        self.version = version
        self.health = health
        self.requests: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake.requests.append(self.path)
                if self.path == "/health":
                    code, body = fake.health, b""
                elif self.path == "/version":
                    code, body = 200, json.dumps({"version": fake.version}).encode()
                elif self.path == "/metrics":
                    if fake.metrics_fn:
                        text = fake.metrics_fn()
                    else:
                        text = fake.metrics.pop(0) if len(fake.metrics) > 1 else fake.metrics[0]
                    code, body = 200, text.encode()
                else:
                    code, body = 404, b""
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def inventory(
    instances: Mapping[str, tuple[str, int, int]],
    hosts: tuple[str, ...] = ("h1", "h2"),
    args: Mapping[str, dict[str, Any]] | None = None,
) -> Inventory:
    """Hosts at 127.0.0.1; ``instances``: name -> (host, GPU, port)."""
    inv = Inventory(path="test.yaml")
    for h in hosts:
        inv.hosts[h] = Host(name=h, address="127.0.0.1")
    inv.models["m"] = Model(name="m", path="/models/m", version="v1")
    inv.engines["e"] = Engine(name="e", path="/opt/vllm/bin/vllm", version="0.11.0")
    for name, (host, gpu, port) in instances.items():
        inv.instances[name] = Instance(
            name=name,
            model="m",
            engine="e",
            placement=(GpuRef(host, gpu),),
            port=port,
            args=dict((args or {}).get(name, {})),
        )
    return inv


def unit(
    name: str,
    active: str = "active",
    sub: str = "running",
    restarts: int = 0,
    port: int = 8000,
    started_s_ago: float = 120.0,
    version: str = "0.11.0",
) -> dict[str, Any]:
    """One instance as the node program's ``read`` reports it."""
    return {
        "unit_text": "",
        "x": {
            "Instance": name,
            "Model": "m",
            "ModelVersion": "v1",
            "Engine": "e",
            "EngineVersion": version,
            "GPUs": "0",
            "Port": str(port),
        },
        "env_present": True,
        "digest": "d",
        "env_hashes": {},
        "active": active,
        "sub": sub,
        "restarts": restarts,
        "main_pid": 4242,
        "enabled": "enabled",
        "started_mono": int((UPTIME_S - started_s_ago) * 1e6),
    }


def fleet_for(
    inv: Inventory, units: Mapping[str, Mapping[str, dict[str, Any]]], down: tuple[str, ...] = ()
) -> tuple[Fleet, FakeTransport]:
    """A Fleet over every host of ``inv``; ``units``: host -> {instance: unit(...)};
    hosts in ``down`` are unreachable; ``systemctl`` commands succeed and are recorded."""

    def handler(host: Host, command: str, stdin: bytes | None) -> FakeReply | HostFailure:
        if host.name in down:
            return HostFailure(HostStatus.UNREACHABLE, "connection refused")
        if "cat /proc/uptime" in command:
            return FakeReply(0, f"{UPTIME_S} 100.0\n")
        if "python3" in command and stdin and b'"op": "read"' in stdin:
            return FakeReply(
                0,
                json.dumps(
                    {
                        "ok": True,
                        "instances": dict(units.get(host.name, {})),
                        "lock": None,
                        "previous": [],
                        "models": {},
                        "users": {},
                    }
                )
                + "\n",
            )
        return FakeReply(0, "")

    t = FakeTransport(handler)
    return Fleet(list(inv.hosts.values()), transport=t, connect_timeout=2, command_timeout=10), t


@pytest.fixture
def server() -> Iterator[Callable[..., FakeVllm]]:
    """``server(**kw)``: a started :class:`FakeVllm` (closed after the test)."""
    made: list[FakeVllm] = []

    def make(**kw: Any) -> FakeVllm:
        made.append(FakeVllm(**kw))
        return made[-1]

    yield make
    for s in made:
        s.close()
