"""Active checks for ``report run --active drift,leak,bench``: requests sent to every instance.

They run on their own, slower schedule (``install-timer --active ... --on-calendar daily``)
and become findings and metrics like doctor's passive checks, so the history, the
new/ongoing/resolved comparison, notifications and charts treat them alike:

- ``drift``: for an instance with a baseline named after it (``clusterctl drift baseline
  URL --name INSTANCE``), replay the baseline and judge it with ``checks/drift.yaml``
  (widened by a calibration of the model when one exists, as ``drift check``).  Failing
  is CRIT (``drift.check``); an instance without a baseline is skipped (listed in
  :attr:`Outcome.skipped`).  Metrics ``drift_exact_match_ratio`` and ``drift_mean_kl``.
- ``leak``: the context-leak check (4 sessions of 3 requests); a sighting is CRIT
  (``drift.leak``).  Metric ``leak_sightings``.
- ``bench``: 8 streamed requests one at a time (128-word prompts, 16 tokens): the
  time to first token now, as a trend.  Metrics ``bench_ttft_p50_seconds`` and
  ``bench_ttft_p99_seconds``; ``bench.ttft`` is OK, or UNKNOWN when no request succeeded.

An endpoint that does not answer is an UNKNOWN finding for that instance and check,
never a stalled run: every request has ``timeout`` seconds.

Each request carries the instance's API key, resolved as deploy resolves it
(:func:`clusterctl.deploy.units.secrets.instance_api_key`: an inline ``env:
VLLM_API_KEY``, else its ``VLLM_API_KEY`` secret), else ``$CLUSTERCTL_API_KEY``;
a protected instance is checked, not "401 UNKNOWN".
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from clusterctl.bench import loadgen
from clusterctl.bench.stats import percentile
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.drift import compare, leak, store
from clusterctl.drift import run as drift_run
from clusterctl.drift.client import EndpointError
from clusterctl.errors import ClusterctlError
from clusterctl.inventory.model import Inventory
from clusterctl.report.filesd import targets as sd_targets
from clusterctl.report.history import Metric
from clusterctl.vllmclient import Endpoint, synthetic_prompt
from clusterctl.deploy.units.secrets import instance_api_key

KINDS = ("drift", "leak", "bench")


@dataclass(frozen=True)
class Target:
    """An instance's API server: ``url`` on its first host ``host``."""

    instance: str
    host: str
    model: str
    url: str
    #: the Bearer token the instance requires (never printed)
    api_key: str | None = field(default=None, repr=False, compare=False)


@dataclass
class Outcome:
    findings: list[Finding] = field(default_factory=list)
    metrics: list[Metric] = field(default_factory=list)
    #: "instance: why" for checks not run (no baseline)
    skipped: list[str] = field(default_factory=list)


def parse_kinds(text: str) -> tuple[str, ...]:
    """``"drift,leak"`` -> ``("drift", "leak")`` in :data:`KINDS` order; an unknown name raises."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in KINDS]
    if bad or not names:
        raise ClusterctlError(f"--active {text!r}: expected a comma-separated list of {', '.join(KINDS)}")
    return tuple(k for k in KINDS if k in names)


def targets(inv: Inventory, hosts: set[str] | None = None) -> list[Target]:
    """Every instance with a placement (the ones whose first host is in ``hosts``, when given), with
    its API key (see the module doc).  Raises :class:`~clusterctl.errors.ConfigError` when a secret
    the inventory names cannot be read (``file:line``, never the value)."""
    out = []
    for g in sd_targets(inv):
        labels = g["labels"]
        if hosts is None or labels["host"] in hosts:
            inst = inv.instances.get(labels["vllm_instance"])
            key = (
                (instance_api_key(inv, inst) if inst is not None else None)
                or os.environ.get("CLUSTERCTL_API_KEY")
                or None
            )
            out.append(
                Target(
                    labels["vllm_instance"], labels["host"], labels["model"], f"http://{g['targets'][0]}", api_key=key
                )
            )
    return out


def _subject(t: Target) -> str:
    return f"instance:{t.instance}"


def _drift(t: Target, ep: Endpoint, out: Outcome, thresholds: Path, state_dir: Path | None) -> None:
    path = store.drift_dir(state_dir) / "baselines" / f"{t.instance}.json"
    if not path.exists():
        out.skipped.append(f"{t.instance}: no drift baseline {path}")
        return
    base = store.load(t.instance, state_dir)
    model = base.env.get("model")
    limits = compare.load_thresholds(thresholds, model)
    cal = store.load_calibration(model, state_dir) if model else None
    if cal:
        limits = limits.calibrated(cal["floor"])
    s = compare.summarize(drift_run.check(ep, base))
    reasons = limits.judge(s)
    what = (
        f"exact match {s['exact_match']:.0%}, vLLM rule {s['vllm_rule_pass']:.0%}, mean KL {s['mean_kl']:.4f} "
        f"over {s['prompts']:g} prompts against baseline {t.instance!r}"
    )
    if reasons:
        out.findings.append(
            Finding(
                "drift.check",
                Severity.CRIT,
                t.host,
                _subject(t),
                f"{what}: {'; '.join(reasons)}",
                "compare the deployment with the baseline's environment (quantization, vLLM "
                "version, GPU, TP size); if the change is intended, record the baseline again",
            )
        )
    else:
        out.findings.append(Finding("drift.check", Severity.OK, t.host, _subject(t), what))
    out.metrics += [
        Metric(t.host, "drift_exact_match_ratio", s["exact_match"], _subject(t)),
        Metric(t.host, "drift_mean_kl", s["mean_kl"], _subject(t)),
    ]


def _leak(t: Target, ep: Endpoint, out: Outcome, timeout: float) -> None:
    rep = leak.run(ep, sessions=4, requests=3, timeout=timeout)
    if rep.requests == 0:
        raise EndpointError("; ".join(rep.errors) or "no request succeeded")
    if rep.sightings:
        s = rep.sightings[0]
        out.findings.append(
            Finding(
                "drift.leak",
                Severity.CRIT,
                t.host,
                _subject(t),
                f"{len(rep.sightings)} cross-session sighting(s) in {rep.requests} responses "
                f"({s.owner}'s canary in {s.seen_by}'s response, {s.where})",
                "one user's prompt reaches another's answer: take the instance out of service "
                "and check prefix caching / KV reuse (clusterctl drift leak URL)",
            )
        )
    else:
        out.findings.append(
            Finding(
                "drift.leak",
                Severity.OK,
                t.host,
                _subject(t),
                f"no canary seen across {rep.sessions} sessions, {rep.requests} responses",
            )
        )
    out.metrics.append(Metric(t.host, "leak_sightings", float(len(rep.sightings)), _subject(t)))


def _bench(t: Target, ep: Endpoint, out: Outcome, timeout: float) -> None:
    rng = random.Random(0)
    prompts = [synthetic_prompt(128, rng) for _ in range(8)]
    res = loadgen.run(ep, prompts, 1, 16, timeout=timeout).results
    ttfts = [r.ttft for r in res if r.ok]
    if not ttfts:
        raise EndpointError("; ".join(sorted({str(r.error) for r in res}))[:300] or "no request succeeded")
    p50, p99 = percentile(ttfts, 50), percentile(ttfts, 99)
    out.findings.append(
        Finding(
            "bench.ttft",
            Severity.OK,
            t.host,
            _subject(t),
            f"TTFT median {1000 * p50:.0f} ms, p99 {1000 * p99:.0f} ms over "
            f"{len(ttfts)} requests (128-word prompts, one at a time)",
        )
    )
    out.metrics += [
        Metric(t.host, "bench_ttft_p50_seconds", p50, _subject(t)),
        Metric(t.host, "bench_ttft_p99_seconds", p99, _subject(t)),
    ]


_CHECK = {"drift": "drift.check", "leak": "drift.leak", "bench": "bench.ttft"}


def run_active(
    tgts: list[Target],
    kinds: tuple[str, ...],
    *,
    thresholds: Path,
    state_dir: Path | None = None,
    timeout: float = 60.0,
    progress: Callable[[str], None] | None = None,
) -> Outcome:
    """Each of ``kinds`` against each target, one after the other (see the module docstring).

    ``thresholds``: the drift limits file (``checks/drift.yaml``); ``state_dir``: where the
    drift baselines and calibrations are (default ``$XDG_STATE_HOME/clusterctl``);
    ``timeout``: seconds one request may take.  A bad baseline or thresholds file raises
    :class:`ClusterctlError` (a configuration error, not a finding).
    """
    out = Outcome()
    for t in tgts:
        ep = Endpoint.parse(t.url).with_key(t.api_key)
        for kind in kinds:
            if progress:
                progress(f"{kind} {t.instance} ({t.url})")
            try:
                if kind == "drift":
                    _drift(t, ep, out, thresholds, state_dir)
                elif kind == "leak":
                    _leak(t, ep, out, timeout)
                else:
                    _bench(t, ep, out, timeout)
            except EndpointError as e:
                out.findings.append(
                    Finding(
                        _CHECK[kind],
                        Severity.UNKNOWN,
                        t.host,
                        _subject(t),
                        f"cannot check: {e}",
                        "check that the instance is running (clusterctl doctor) and reachable from this host",
                    )
                )
    return out
