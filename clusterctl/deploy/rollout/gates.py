"""Health gates: is a started instance really serving?

An instance passes when, checked in this order from the control machine:

1. its unit is ``active`` (read on the host; ``failed``, or a restart since
   the start, fails the gate at once: the engine died);
2. ``GET /health`` answers 200;
3. ``GET /v1/models`` lists the served model name;
4. a one-token ``POST /v1/completions`` succeeds (vLLM's /health does not see
   a hung engine; a completion does), with the API key as a bearer token.

vLLM has no readiness notification, so the checks are polled until they
all pass or ``timeout_s`` runs out (model loading takes minutes on real
hardware: ``--gate-timeout``): at once, then after 0.25 s and 0.5 s (an
engine whose load is short, e.g. from the page cache, is not held back by
a whole ``poll_s``), then every ``poll_s``.  The call returns as soon as
every target has a result, without a last wait.  Each HTTP request is
bounded by ``request_timeout_s``.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

#: The gate's steps, in order.
STEPS = ("unit", "health", "models", "completion")
#: The waits (seconds) after the first poll rounds, before ``poll_s`` takes over (each at most ``poll_s``).
FIRST_WAITS_S = (0.25, 0.5)
#: (active, sub, restarts) of one instance's unit, as the host reports it.
UnitState = tuple[str, str, int]
#: Reads the units of the instances being gated: instance -> state (missing: unknown).
UnitReader = Callable[[], Mapping[str, UnitState]]


@dataclass(frozen=True)
class GateTarget:
    """One instance to gate.  ``api_key`` is sent as a bearer token, never logged."""

    instance: str
    host: str
    address: str
    port: int
    served_name: str
    api_key: str | None = None
    restarts_before: int = 0

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"


@dataclass
class GateResult:
    """``ok``, or the step that failed last (``unit``, ``health``, ``models``, ``completion``) and why.
    ``inconclusive``: not ok because the gate could not decide (a release gate whose measurement was
    untrusted or too noisy): no pass, and no regression either."""

    instance: str
    host: str
    ok: bool
    step: str
    reason: str
    seconds: float
    inconclusive: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "host": self.host,
            "ok": self.ok,
            "step": self.step,
            "reason": self.reason,
            "seconds": round(self.seconds, 2),
            "inconclusive": self.inconclusive,
        }


def request(t: GateTarget, path: str, body: dict[str, Any] | None, timeout: float) -> tuple[int, bytes]:
    """One HTTP request to the instance (POST with a JSON ``body``, else GET): ``(status, body bytes)``."""
    headers = {"Content-Type": "application/json"}
    if t.api_key:
        headers["Authorization"] = f"Bearer {t.api_key}"
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(t.url + path, data=data, headers=headers, method="POST" if data else "GET")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def check_http(t: GateTarget, timeout: float = 5.0) -> tuple[str, str | None]:
    """One pass of steps 2-4: ``(step, None)`` when all pass, else ``(failed step, why)``."""
    step = "health"
    try:
        status, _ = request(t, "/health", None, timeout)
        if status != 200:
            return step, f"/health answered {status}"
        step = "models"
        status, raw = request(t, "/v1/models", None, timeout)
        if status != 200:
            return step, f"/v1/models answered {status}"
        names = [m.get("id") for m in json.loads(raw).get("data", [])]
        if t.served_name not in names:
            return step, f"/v1/models lists {names}, not {t.served_name!r}"
        step = "completion"
        status, raw = request(
            t, "/v1/completions", {"model": t.served_name, "prompt": "ping", "max_tokens": 1, "temperature": 0}, timeout
        )
        if status != 200:
            return step, f"one-token completion answered {status}: {raw[:200].decode('utf-8', 'replace')}"
        if not json.loads(raw).get("choices"):
            return step, "one-token completion returned no choices"
        return step, None
    except (OSError, ValueError) as e:
        reason = getattr(e, "reason", None) or e
        return step, f"{type(e).__name__}: {reason}"


def unit_failure(t: GateTarget, state: UnitState | None) -> str | None:
    """Why the unit state means the instance died, or ``None`` (still starting or active)."""
    if state is None:
        return None
    active, sub, restarts = state
    if active == "failed":
        return f"unit failed ({sub})"
    if sub == "auto-restart" or restarts > t.restarts_before:
        return f"unit restarted after a crash (NRestarts {restarts}, {active}/{sub})"
    if active == "inactive":
        return "unit is inactive (exited)"
    return None


def wait_gates(
    targets: Sequence[GateTarget],
    *,
    timeout_s: float,
    units: UnitReader | None = None,
    poll_s: float = 1.0,
    request_timeout_s: float = 5.0,
    on_result: Callable[[GateResult], None] | None = None,
    explain: Callable[[GateTarget], str] | None = None,
) -> list[GateResult]:
    """Poll every target until it passes, its unit dies, or ``timeout_s`` passes.

    Returns one result per target, in order.  ``units()`` (one SSH read of
    the hosts) is called on every poll round while some target is pending.
    ``explain(target)``: why a unit died (the journal's first error,
    :func:`clusterctl.deploy.rollout.journal.first_error`), appended to the reason.
    """
    t0 = time.monotonic()
    end = t0 + timeout_s
    done: dict[str, GateResult] = {}
    last: dict[str, tuple[str, str]] = {t.instance: ("unit", "not checked yet") for t in targets}
    rounds = 0

    def finish(t: GateTarget, ok: bool, step: str, reason: str) -> None:
        done[t.instance] = GateResult(t.instance, t.host, ok, step, reason, time.monotonic() - t0)
        if on_result:
            on_result(done[t.instance])

    while True:
        pending = [t for t in targets if t.instance not in done]
        if not pending:
            break
        states = units() if units else {}
        ready: list[GateTarget] = []
        for t in pending:
            st = states.get(t.instance)
            dead = unit_failure(t, st)
            if dead:
                finish(t, False, "unit", f"{dead}; {explain(t)}" if explain else dead)
            elif st is not None and st[0] != "active":
                last[t.instance] = ("unit", f"unit is {st[0]}/{st[1]}")
            else:
                ready.append(t)
        budget = max(0.5, min(request_timeout_s, end - time.monotonic()))
        with cf.ThreadPoolExecutor(max_workers=max(1, min(32, len(ready)))) as ex:
            checked = list(ex.map(lambda t: check_http(t, budget), ready))
        for t, (step, why) in zip(ready, checked):
            if why is None:
                finish(t, True, step, "active, /health 200, model listed, one-token completion ok")
            elif STEPS.index(step) >= STEPS.index(last[t.instance][0]):
                last[t.instance] = (step, why)  # report the furthest step reached: it says most
        if len(done) == len(targets):
            break
        if time.monotonic() >= end:
            for t in targets:
                if t.instance not in done:
                    step, why = last[t.instance]
                    finish(t, False, step, f"not ready after {timeout_s:g} s: {why}")
            break
        wait = min(poll_s, FIRST_WAITS_S[rounds]) if rounds < len(FIRST_WAITS_S) else poll_s
        rounds += 1
        time.sleep(max(0.0, min(wait, end - time.monotonic())))
    return [done[t.instance] for t in targets]
