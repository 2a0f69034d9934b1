"""A replica across nodes in the simulator: vLLM's multiprocessing executor over ``--nnodes`` (0.33 only).

Real vLLM (>= 0.11.1; vllm-project/vllm#23691; the 0.32 wheel's
``entrypoints/cli/serve.py``, ``config/parallel.py``, ``engine/arg_utils.py``,
``v1/executor/multiproc_executor.py``): every node runs ``vllm serve`` with
``--nnodes N --node-rank R --master-addr A --master-port P``; the others add
``--headless`` and run only workers.  The head's engine cannot start before
every rank joined torch.distributed, so its API server (and ``/health``)
comes up only then; a lost rank fails the collective and the engine dies.

Here a headless rank connects to the head's ``--master-port`` over TCP and
says its rank (retrying until the head listens); the head listens there
before it loads, waits for all N-1 ranks, and from then on watches the
connections: one that closes (the rank's unit stopped, its host gone) kills
the engine, which then takes the head down as an engine death does
(serve.py: ``/health`` 503, then the watchdog's exit).  A headless rank whose
head goes away exits with status 1 (its unit fails; systemd restarts it).

Log lines with their source (0.32): ``Launching vLLM (v%s) headless
multiproc executor, with head node address %s for torch.distributed process
group.`` (serve.py:224); ``DP group leader: node_rank=%d,
node_rank_within_dp=%d, master_addr=%s, mq_connect_ip=%s (local),
world_size=%d, local_world_size=%d`` (multiproc_executor.py:153); the two
``Invalid data-parallel launch options`` errors (arg_utils.py:2366, 2374).
"""

from __future__ import annotations

import select
import socket
import threading
import time
from typing import Any, Callable

from .logs import Log

HELLO = b"vllm-sim-rank "


def world_size(ns: Any) -> int:
    return int(ns.tensor_parallel_size) * int(ns.pipeline_parallel_size) * int(ns.data_parallel_size)


def check(ns: Any) -> str | None:
    """vLLM's own refusals of the launch options (the ValueError text), or None."""
    n, r = int(getattr(ns, "nnodes", 1)), int(getattr(ns, "node_rank", 0))
    if n <= 1:
        return None
    w = world_size(ns)
    if w % n:
        return (
            "ValueError: Invalid data-parallel launch options: "
            f"`--nnodes {n}` must evenly divide the total world size ({w}). Adjust `--nnodes`, "
            "`--data-parallel-size`, `--pipeline-parallel-size`, `--tensor-parallel-size`, or "
            "`--prefill-context-parallel-size`."
        )
    if not 0 <= r < n:
        return (
            "ValueError: Invalid data-parallel launch options: `--node-rank` must "
            f"be between 0 and {n - 1}; got `--node-rank {r}`. Set it to this node's zero-based index."
        )
    return None


def is_head(ns: Any) -> bool:
    return int(getattr(ns, "nnodes", 1)) > 1 and int(getattr(ns, "node_rank", 0)) == 0


def is_worker(ns: Any) -> bool:
    return int(getattr(ns, "nnodes", 1)) > 1 and int(getattr(ns, "node_rank", 0)) > 0


class Head:
    """The head's side: listen on the master port, wait for every rank, then watch them."""

    def __init__(self, ns: Any, log: Log):
        self.ns, self.log = ns, log
        self.n = int(ns.nnodes)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("0.0.0.0", int(ns.master_port)))
        self.sock.listen(self.n)
        self.ranks: dict[int, socket.socket] = {}

    def wait(self, stopped: Callable[[], bool]) -> None:
        """Block until ranks 1..N-1 joined (or ``stopped()``)."""
        self.sock.settimeout(0.2)
        while len(self.ranks) < self.n - 1 and not stopped():
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            conn.settimeout(5)
            try:
                line = conn.recv(64)
            except OSError:
                conn.close()
                continue
            if line.startswith(HELLO):
                self.ranks[int(line[len(HELLO) :].strip() or 0)] = conn
            else:
                conn.close()
        w = world_size(self.ns)
        self.log.info(
            "EngineCore",
            "multiproc_executor.py:153",
            f"DP group leader: node_rank=0, node_rank_within_dp=0, master_addr={self.ns.master_addr}, "
            f"mq_connect_ip={self.ns.master_addr} (local), world_size={w}, local_world_size={w // self.n}",
        )

    def watch(self, on_lost: Callable[[int], None]) -> None:
        """In a thread: call ``on_lost(rank)`` once, when the first rank's connection closes."""

        def run() -> None:
            socks = {s: r for r, s in self.ranks.items()}
            while socks:
                ready, _, _ = select.select(list(socks), [], [], 1.0)
                for s in ready:
                    try:
                        data = s.recv(64)
                    except OSError:
                        data = b""
                    if not data:
                        on_lost(socks[s])
                        return

        threading.Thread(target=run, daemon=True, name="vllm-sim-ranks").start()

    def close(self) -> None:
        for s in self.ranks.values():
            s.close()
        self.sock.close()


def run_worker(ns: Any, log: Log, version: str, stop: threading.Event) -> int:
    """A headless rank: join the head, hold the connection; 0 when stopped, 1 when the head went away."""
    addr = f"{ns.master_addr}:{ns.master_port}"
    log.info(
        "APIServer",
        "serve.py:224",
        f"Launching vLLM (v{version}) headless multiproc executor, with head "
        f"node address {addr} for torch.distributed process group.",
    )
    conn: socket.socket | None = None
    while conn is None and not stop.is_set():
        try:
            conn = socket.create_connection((ns.master_addr, int(ns.master_port)), timeout=2)
            conn.sendall(HELLO + str(int(ns.node_rank)).encode() + b"\n")
        except OSError:
            conn = None
            stop.wait(0.5)
    if conn is None:
        return 0
    conn.setblocking(False)
    try:
        while not stop.is_set():
            ready, _, _ = select.select([conn], [], [], 0.5)
            if ready:
                try:
                    data = conn.recv(64)
                except OSError:
                    data = b""
                if not data:
                    # not a vLLM line (a real rank sees its collective fail): the simulator says what happened
                    log.error(
                        "APIServer",
                        "vllm_sim/multinode.py",
                        f"head node {addr} went away: torch.distributed process group lost; exiting",
                    )
                    time.sleep(0.1)
                    return 1
        return 0
    finally:
        conn.close()
