"""A playbook's custom gates (http, metric, exec), checked per instance after the standard gate.

Each gate is polled every ``poll_s`` seconds until it passes or its own
``timeout_s`` runs out; an instance's gates are checked in order and the
first that does not pass fails the instance.  HTTP requests are bounded by
``request_timeout_s`` and carry the instance's API key as a bearer token
(never logged).  ``drift`` and ``bench`` gates run the release gates of
:mod:`clusterctl.drift.gate` and :mod:`clusterctl.bench.gate` once.  An ``exec`` gate runs on the instance's host with
``INSTANCE``, ``PORT`` and ``ADDRESS`` exported first (values quoted,
:func:`with_vars`).
"""

from __future__ import annotations

import concurrent.futures as cf
import re
import time
from typing import Callable, Mapping, Sequence

from clusterctl.deploy.rollout import gates
from clusterctl.deploy.rollout.gates import GateResult, GateTarget
from clusterctl.deploy.playbooks.load import ONE_SHOT, CustomGate
from clusterctl.diagnose.serving import parse_metrics, total
from clusterctl.errors import ClusterctlError
from clusterctl.fleet import shell
from clusterctl.bench import gate as bench_gates
from clusterctl.drift import gate as drift_gates

#: ``run_exec(host, command, timeout_s)`` -> ``(rc, why)``: rc ``None`` when it did not run (why says so).
ExecRunner = Callable[[str, str, float], tuple[int | None, str]]
#: ``reference(instance)`` -> ``(url, api_key)`` of a bench gate's reference; raises ClusterctlError.
RefResolver = Callable[[str], tuple[str, str | None]]


def with_vars(command: str, env: Mapping[str, str]) -> str:
    """``command`` run with ``env`` exported first (values quoted), so ``$NAME`` in it sees them.

    (``env NAME=value command`` would not do: the shell expands ``$NAME``
    before ``env`` runs.)"""
    for name in env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"not a valid environment variable name: {name!r}")
    sets = " ".join(f"{k}={shell.quote(v)}" for k, v in env.items())
    return f"{sets}; export {' '.join(env)}; {command}" if env else command


def release_gate(g: CustomGate, t: GateTarget, reference: RefResolver | None) -> str | None:
    """The drift or bench release gate (:mod:`clusterctl.drift.gate`, :mod:`clusterctl.bench.gate`)
    on ``t``: ``None`` when it passes, else its one-line reason.  Both fail closed."""
    if g.type == "drift":
        out = drift_gates.drift_gate(
            t.url,
            g.baseline,
            api_key=t.api_key,
            thresholds=g.thresholds,
            use_calibration=g.calibration,
            timeout=g.timeout_s,
        )
        return None if out.ok else out.reason

    if reference is None:
        return "bench gate: no reference instance can be resolved here"
    try:
        ref_url, ref_key = reference(g.reference)
    except ClusterctlError as e:
        return f"bench gate: reference {g.reference!r}: {e}"
    out = bench_gates.bench_gate(
        t.url,
        ref_url,
        api_key=t.api_key,
        reference_api_key=ref_key,
        concurrency=g.concurrency,
        requests=g.requests,
        tolerance=g.tolerance,
        timeout=g.timeout_s,
    )
    return None if out.ok else out.reason


def check_once(
    g: CustomGate,
    t: GateTarget,
    run_exec: ExecRunner,
    request_timeout_s: float = 5.0,
    reference: RefResolver | None = None,
) -> str | None:
    """One check of ``g`` on ``t``: ``None`` when it passes, else why not."""
    if g.type in ONE_SHOT:
        return release_gate(g, t, reference)
    try:
        if g.type == "http":
            status, body = gates.request(t, g.path, None, request_timeout_s)
            if status != g.expect_status:
                return f"GET {g.path} answered {status}, expected {g.expect_status}"
            if g.contains is not None and g.contains not in body.decode("utf-8", "replace"):
                return f"GET {g.path}: the answer does not contain {g.contains!r}"
            return None
        if g.type == "metric":
            status, body = gates.request(t, "/metrics", None, request_timeout_s)
            if status != 200:
                return f"/metrics answered {status}"
            value = total(parse_metrics(body.decode("utf-8", "replace")), g.metric)
            if value is None:
                return f"/metrics has no {g.metric}"
            if g.max is not None and value > g.max:
                return f"{g.metric} is {value:g}, above the maximum {g.max:g}"
            if g.min is not None and value < g.min:
                return f"{g.metric} is {value:g}, below the minimum {g.min:g}"
            return None
    except (OSError, ValueError) as e:
        return f"{type(e).__name__}: {getattr(e, 'reason', None) or e}"
    command = with_vars(g.command, {"INSTANCE": t.instance, "PORT": str(t.port), "ADDRESS": t.address})
    rc, why = run_exec(t.host, command, max(1.0, g.timeout_s))
    if rc is None:
        return why
    return None if rc == g.expect_rc else f"exit status {rc}, expected {g.expect_rc}" + (f": {why}" if why else "")


def wait_one(
    t: GateTarget,
    custom: Sequence[CustomGate],
    run_exec: ExecRunner,
    *,
    poll_s: float = 1.0,
    request_timeout_s: float = 5.0,
    reference: RefResolver | None = None,
) -> GateResult:
    """Poll ``t``'s gates in order (drift and bench run once); the result names the first gate
    that did not pass in time."""
    t0 = time.monotonic()
    for g in custom:
        end = time.monotonic() + g.timeout_s
        while True:
            why = check_once(g, t, run_exec, min(request_timeout_s, g.timeout_s), reference)
            if why is None:
                break
            if g.type in ONE_SHOT:
                return GateResult(
                    t.instance,
                    t.host,
                    False,
                    f"custom: {g.describe()}",
                    f"custom gate {g.describe()}: {why}",
                    time.monotonic() - t0,
                )
            if time.monotonic() + poll_s > end:
                return GateResult(
                    t.instance,
                    t.host,
                    False,
                    f"custom: {g.describe()}",
                    f"custom gate {g.describe()}: not passed after {g.timeout_s:g} s: {why}",
                    time.monotonic() - t0,
                )
            time.sleep(poll_s)
    return GateResult(t.instance, t.host, True, "custom", f"{len(custom)} custom gate(s) passed", time.monotonic() - t0)


def wait_custom(
    targets: Sequence[GateTarget],
    custom: Sequence[CustomGate],
    run_exec: ExecRunner,
    *,
    poll_s: float = 1.0,
    on_result: Callable[[GateResult], None] | None = None,
    reference: RefResolver | None = None,
) -> list[GateResult]:
    """Every target's custom gates, targets in parallel; one result per target, in order."""
    if not targets:
        return []
    with cf.ThreadPoolExecutor(max_workers=min(32, len(targets))) as ex:
        futures = [ex.submit(wait_one, t, custom, run_exec, poll_s=poll_s, reference=reference) for t in targets]
        results = []
        for f in futures:
            r = f.result()
            if on_result:
                on_result(r)
            results.append(r)
    return results
