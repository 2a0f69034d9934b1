"""``vllm serve``: bind the port, start the engine, serve until SIGTERM/SIGINT.

Exit status: 0 after SIGTERM/SIGINT once serving (graceful, as uvicorn);
killed by SIGTERM when it arrives during start-up; 1 when start-up
fails (vLLM's error text on stdout); 0 too after a simulated engine death
(SIGUSR1: /health answers 503 until the watchdog stops the server, 5 s
scaled, unless ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH=1``), as real vLLM does.  GPU memory registered
in the fake NVML state is released on every exit path except SIGKILL (the
next simulator start drops dead entries, as a driver would).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from typing import Any

from . import gpu, memory
from . import multinode, profiles
from .batching import EXECUTE_TIMEOUT_S, StepEngine
from .faults import Faults
from .profiles import ModelCost
from .scheduler import Scheduler
from .toylm import ToyLM
from .logs import Log
from .metrics import Metrics, cache_config_labels
from .server import ROUTES, App, Server, make_handler
from .startup import Starter, StartupFailure, report_failure
from .kvtransfer import Link, parse_kv_config
import sys

STATS_INTERVAL_S = 5.0


class _Terminated(Exception):
    """SIGTERM/SIGINT arrived during start-up."""


WATCHDOG_S = 5.0


def _scale(ns: Any, env: dict[str, str]) -> float:
    if ns.time_scale is not None:
        return max(0.0, ns.time_scale)
    try:
        return max(0.0, float(env.get("VLLM_SIM_TIME_SCALE", "1")))
    except ValueError:
        return 1.0


def _startup_scale(scale: float, env: dict[str, str]) -> float:
    """``$VLLM_SIM_STARTUP_SCALE``: the scale of the start-up's delays alone (default: the time scale), so a
    test can serve slowly (queues under a few requests per second) yet start in simulated real time."""
    try:
        return max(0.0, float(env["VLLM_SIM_STARTUP_SCALE"]))
    except (KeyError, ValueError):
        return scale


def _shown_args(given: dict[str, Any], version: str) -> dict[str, Any]:
    if version == "0.33" and "api_key" in given:
        return {**given, "api_key": "***"}
    return given  # 0.11 prints --api-key in clear, as the real one does


def serve(ns: Any, given: dict[str, Any], version: str, env: dict[str, str]) -> int:
    """Run the server; returns the process exit status."""
    scale = _scale(ns, env)
    prof_name = ns.sim_profile or env.get("VLLM_SIM_PROFILE") or None
    if prof_name is not None and prof_name not in profiles.PROFILES:
        src = "--sim-profile" if ns.sim_profile else "VLLM_SIM_PROFILE"
        print(
            f"vllm serve: error: {src}: unknown simulator profile {prof_name!r} "
            f"(known: {', '.join(sorted(profiles.PROFILES))})",
            file=sys.stderr,
        )
        return 2
    stop = threading.Event()

    startup_scale = _startup_scale(scale, env)

    def sleep(seconds: float) -> None:
        if stop.wait(seconds * startup_scale) if startup_scale > 0 else stop.is_set():
            raise _Terminated()

    log = Log()
    full = {"0.11": "0.11.0", "0.33": "0.33.0"}[version]
    log.info(
        "APIServer",
        "api_server.py:1839" if version == "0.11" else "api_server.py:1936",
        f"vLLM API server version {full}",
    )
    log.info(
        "APIServer",
        "utils.py:233" if version == "0.11" else "startup.py:96",
        f"non-default args: {_shown_args(given, version)}",
    )
    bad = multinode.check(ns)
    if bad:
        report_failure(
            log,
            StartupFailure(
                bad, where="api", frames=[("engine/arg_utils.py", 2366, "create_engine_config", "raise ValueError(")]
            ),
            version,
            ns.tensor_parallel_size,
        )
        return 1
    if multinode.is_worker(ns) and getattr(ns, "headless", False):  # a headless rank: no API server
        signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
        signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
        return multinode.run_worker(ns, log, full, stop)
    host = ns.host or "0.0.0.0"
    try:
        httpd = Server(host, ns.port)
        httpd.server_bind()
    except OSError as e:
        log.raw("APIServer", f"OSError: [Errno {e.errno}] {e.strerror}")
        return 1
    except OverflowError as e:
        log.raw("APIServer", f"OverflowError: {e}")
        return 1
    state = gpu.state_path(env)
    exit_code = [0]

    def on_term(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    starter = Starter(ns, version, env, log, sleep)
    head = multinode.Head(ns, log) if multinode.is_head(ns) else None
    try:
        if head is not None:  # the engine starts once every rank joined
            head.wait(stop.is_set)
            if stop.is_set():
                raise _Terminated()
        info = starter.run()
    except StartupFailure as f:
        report_failure(log, f, version, ns.tensor_parallel_size)
        gpu.release(state)
        httpd.server_close()
        return 1
    except _Terminated:
        # Stopped while loading: no handler is installed yet in vLLM, so it dies by the signal.
        gpu.release(state)
        httpd.server_close()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return 143
    except BaseException:
        gpu.release(state)
        raise
    try:
        return _run(ns, env, version, log, httpd, info, stop, scale, exit_code, prof_name, head)
    finally:
        gpu.release(state)
        httpd.server_close()
        if head is not None:
            head.close()


def _make_engine(
    ns: Any, env: dict[str, str], info: Any, scale: float, metrics: Metrics, log: Log, prof_name: str | None
) -> StepEngine:
    """The step engine for what start-up resolved (profile: flag, env, else from the GPU model)."""
    rank0 = info.plan.ranks[0] if info.plan and info.plan.ranks else None
    name = prof_name or profiles.default_profile(info.gpu_name, rank0.total if rank0 else None)
    kvb = 1 if str(info.kv_dtype).startswith("fp8") else 2
    cost = ModelCost.from_shape(info.shape, rank0.weights if rank0 else 0, max(1, info.tp), kvb)
    noise = ns.sim_batch_noise if ns.sim_batch_noise is not None else env.get("VLLM_SIM_BATCH_NOISE", "1") != "0"
    broken = ns.sim_broken_quantization or env.get("VLLM_SIM_BROKEN_QUANTIZATION") == "1"
    lm = ToyLM(info.quantization, broken=broken, noise=noise)
    sched = Scheduler(
        profiles.get(name),
        cost,
        lm,
        num_blocks=info.num_blocks,
        max_num_seqs=info.max_num_seqs,
        max_num_batched_tokens=info.max_num_batched_tokens,
        block_size=info.block_size,
        prefix_caching=info.prefix_caching,
        full_prompt_admission=info.version != "0.11",
    )
    try:
        timeout = float(env.get("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", EXECUTE_TIMEOUT_S))
    except ValueError:
        timeout = EXECUTE_TIMEOUT_S
    proc = "EngineCore_DP0" if info.version == "0.11" else "EngineCore"
    return StepEngine(
        sched,
        vocab=info.vocab,
        scale=scale,
        metrics=metrics,
        faults=Faults(),
        execute_timeout_s=timeout,
        on_error=lambda msg: log.error(proc, "multiproc_executor.py:194", msg),
    )


def _disaggregate(app: App, ns: Any, env: dict[str, str], info: Any, scale: float, metrics: Metrics, log: Log) -> None:
    """Give the app its KV-transfer role (kvtransfer.py); the config was checked at start-up."""
    app.kv = parse_kv_config(ns.kv_transfer_config)
    app.link = Link(env, nics=max(1, info.tp))
    app.scale = scale
    app.kv_host = env.get("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost")
    try:
        app.kv_side_port = int(env.get("VLLM_NIXL_SIDE_CHANNEL_PORT", "5600"))
    except ValueError:
        app.kv_side_port = 5600
    kvb = 1 if str(info.kv_dtype).startswith("fp8") else 2
    app.kv_bytes_per_token = float(memory.kv_bytes_per_token(info.shape, 1, kvb)) if info.shape else 0.0
    if app.kv.connector.startswith("Nixl"):
        metrics.enable_nixl()
    log.info(
        "EngineCore",
        "factory.py:64",
        f"Creating v1 connector with name: {app.kv.connector} and engine_id: {app.kv.engine_id}",
    )


def _run(
    ns: Any,
    env: dict[str, str],
    version: str,
    log: Log,
    httpd: Server,
    info: Any,
    stop: threading.Event,
    scale: float,
    exit_code: list[int],
    prof_name: str | None = None,
    head: multinode.Head | None = None,
) -> int:
    labels = cache_config_labels(
        block_size=info.block_size,
        cache_dtype=info.kv_dtype,
        util=info.util,
        prefix=info.prefix_caching,
        num_gpu_blocks=info.num_blocks,
        version=version,
        kv_memory_bytes=ns.kv_cache_memory_bytes,
    )
    metrics = Metrics(version, info.served_names[0], labels, ns.show_hidden_metrics_for_version)
    engine = _make_engine(ns, env, info, scale, metrics, log, prof_name)
    keys = ns.api_key or ([env["VLLM_API_KEY"]] if env.get("VLLM_API_KEY") else [])
    app = App(
        info,
        engine,
        metrics,
        log,
        api_keys=keys,
        load_tracking=ns.enable_server_load_tracking,
        access_log=not ns.disable_uvicorn_access_log,
        force_usage=ns.enable_force_include_usage,
    )
    app.faults = engine.faults
    if ns.kv_transfer_config:
        _disaggregate(app, ns, env, info, scale, metrics, log)
    httpd.RequestHandlerClass = make_handler(app)
    log.info(
        "APIServer",
        "loggers.py:147",
        f"Engine 000: vllm cache_config_info with initialization after num_gpu_blocks is: {info.num_blocks}",
    )
    log.info("APIServer", "api_server.py:1634", "Supported_tasks: ['generate']")
    host, port = ns.host or "0.0.0.0", httpd.server_address[1]
    if version == "0.11":
        log.info("APIServer", "api_server.py:1912", f"Starting vLLM API server 0 on http://{host}:{port}")
    else:
        log.info("APIServer", "entry.py:139", f"Starting vLLM server on http://{host}:{port}")
    log.info("APIServer", "launcher.py:34", "Available routes are:")
    for route, methods in ROUTES:
        log.info("APIServer", "launcher.py:42", f"Route: {route}, Methods: {methods}")
    log.uvicorn(f"Started server process [{os.getpid()}]")
    log.uvicorn("Waiting for application startup.")

    def on_death(signum: int, _frame: Any) -> None:
        engine.dead = True

    # Before the server says it is up: SIGUSR1's default action kills the process, so a death
    # signalled right after "Application startup complete." must already find the handler.
    signal.signal(signal.SIGUSR1, on_death)
    httpd.server_activate()  # listen(): connections are accepted from here on
    log.uvicorn("Application startup complete.")
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    t.start()

    if head is not None:  # a lost rank fails the engine's collectives: the engine dies
        head.watch(lambda rank: setattr(engine, "dead", True))

    try:  # vLLM's own knob for the stats line's period (envs.py; 10 s there, 5 s here unless set)
        base = float(env.get("VLLM_LOG_STATS_INTERVAL") or STATS_INTERVAL_S)
    except ValueError:
        base = STATS_INTERVAL_S
    base = base if base > 0 else STATS_INTERVAL_S
    interval = base * scale if scale > 0 else base
    interval = max(interval, 0.05)
    last = (0.0, 0.0)
    last_t = time.monotonic()
    was_busy = False
    death_at: float | None = None
    while not stop.wait(min(interval, 0.1)):
        now = time.monotonic()
        if engine.dead and death_at is None:
            death_at = now
            if version == "0.11":
                log.error(
                    "APIServer",
                    "core_client.py:564",
                    "Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.",
                )
            else:  # the 0.32 wording (v1/engine/core_client.py), measured on the real engine
                log.warning(
                    "APIServer",
                    "core_client.py:818",
                    "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup",
                )
        if (
            death_at is not None
            and env.get("VLLM_KEEP_ALIVE_ON_ENGINE_DEATH") != "1"
            and now - death_at >= WATCHDOG_S * (scale if scale > 0 else 0)
        ):
            # The watchdog sets uvicorn's should_exit: a graceful stop, status 0 (real vLLM 0.32 measured;
            # vLLM issue 48966) -- only Restart=always brings such a unit back.
            log.error("APIServer", "launcher.py:117", "Engine client died. Shutting down server.")
            exit_code[0] = 0
            break
        if now - last_t < interval or ns.disable_log_stats:
            continue
        c = metrics.counters
        cur = (c["vllm:prompt_tokens"], c["vllm:generation_tokens"])
        dt = max(1e-9, (now - last_t) / (scale if scale > 0 else 1))
        st = engine.stats()
        busy = cur != last or st.running > 0
        if busy or was_busy:
            pt, gt = (cur[0] - last[0]) / dt, (cur[1] - last[1]) / dt
            msg = (
                f"Engine 000: Avg prompt throughput: {pt:.1f} tokens/s, Avg generation throughput: "
                f"{gt:.1f} tokens/s, Running: {st.running} reqs, Waiting: {st.waiting} reqs, "
            )
            # No "Preemptions: N" field, as measured on real vLLM 0.32 under preemption: its LoggingStatLogger.log()
            # calls _update_stats(), which resets the interval's preemption count, before it tests that count
            # for "> 0" (v1/metrics/loggers.py), so the field never shows; vllm:num_preemptions_total has them.
            q, h = c["vllm:prefix_cache_queries"], c["vllm:prefix_cache_hits"]
            msg += (
                f"GPU KV cache usage: {st.kv_usage * 100:.1f}%, Prefix cache hit rate: {100 * h / q if q else 0.0:.1f}%"
            )
            log.info("APIServer", "loggers.py:127", msg)
        was_busy = busy
        last, last_t = cur, now
    log.uvicorn("Shutting down")
    httpd.shutdown()
    engine.close()
    log.uvicorn("Waiting for application shutdown.")
    log.uvicorn("Application shutdown complete.")
    log.uvicorn(f"Finished server process [{os.getpid()}]")
    return exit_code[0]


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for tests)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
