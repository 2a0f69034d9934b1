"""The drift workflows (``clusterctl drift``): a baseline recorded and stored, a drift check with
its verdict, the noise floor measured and stored, and the context-leak check over one or many
instances (docs/drift.md).

Targets are endpoints (:func:`endpoint`, :func:`leak_targets`): a URL, or inventory instances
(template replicas too, where placement recorded them), the inventory read only when a name needs
it (``load_inventory``, then ``load_config`` for the state it is read as deployed in).  Requests
time out after ``timeout`` seconds each.  Errors are :class:`~clusterctl.errors.ClusterctlError`
(an unreachable endpoint is :class:`~clusterctl.drift.client.EndpointError`); the leak check
reports a target that does not answer as a result with its errors, not as an exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from clusterctl.bench.target import instance_endpoint, is_url, resolve
from clusterctl.config import UserConfig
from clusterctl.deploy.placement.deployed import with_replicas
from clusterctl.deploy.status.instances import match_instances
from clusterctl.diagnose.thresholds import check_file
from clusterctl.drift import leak, prompts as prompt_sets, run as runs, store, verdict
from clusterctl.drift.client import EndpointError
from clusterctl.drift.leak import LeakReport
from clusterctl.drift.prompts import Prompt
from clusterctl.drift.store import Baseline
from clusterctl.drift.verdict import Verdict
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode
from clusterctl.inventory.model import Inventory
from clusterctl.vllmclient import Endpoint

LoadInventory = Callable[[], Inventory]
LoadConfig = Callable[[], UserConfig]


def _deployed(load_inventory: LoadInventory, load_config: LoadConfig) -> LoadInventory:
    """The inventory as deployed; the config read after the inventory (loading it may bind the state)."""

    def load() -> Inventory:
        inv = load_inventory()
        return with_replicas(inv, cfg=load_config())

    return load


def endpoint(target: str, load_inventory: LoadInventory, load_config: LoadConfig) -> Endpoint:
    """The endpoint of ``target`` (a URL, or an inventory instance with its address, port and API key);
    raises ``ClusterctlError`` on a bad URL, an unknown instance or an unreadable secret."""
    return resolve(target, _deployed(load_inventory, load_config))


def prompts(path: Optional[str]) -> list[Prompt]:
    """The prompt set at ``path`` (JSONL), default ``checks/drift/basic.jsonl``."""
    return prompt_sets.load(path or check_file("drift/basic.jsonl"))


@dataclass(frozen=True)
class Recorded:
    """A baseline recorded from an endpoint and where it was stored."""

    baseline: Baseline
    path: Path


def record_baseline(
    ep: Endpoint,
    name: str,
    prompts_path: Optional[str],
    *,
    k: int = 8,
    seed: int = 0,
    extra_env: Optional[dict[str, Any]] = None,
    timeout: float = 60.0,
) -> Recorded:
    """Greedy outputs (``k`` top logprobs per token, ``seed``) of the prompt set as the baseline
    ``name``, stored under the state directory (``drift.store``)."""
    b = runs.record(ep, name, prompts(prompts_path), k=k, seed=seed, extra_env=extra_env, timeout=timeout)
    return Recorded(b, store.save(b))


def check(
    ep: Endpoint,
    baseline: str,
    *,
    thresholds: Optional[str] = None,
    use_calibration: bool = True,
    timeout: float = 60.0,
) -> Verdict:
    """The endpoint's outputs against the baseline (``drift.verdict.check``)."""
    return verdict.check(ep, baseline, thresholds=thresholds, use_calibration=use_calibration, timeout=timeout)


def check_code(v: Verdict) -> ExitCode:
    """``drift check``'s exit code: 0 pass, 2 fail."""
    return ExitCode.CRIT if v.reasons else ExitCode.OK


@dataclass(frozen=True)
class Calibrated:
    """The noise floor measured (``drift.run.calibrate``'s document) and where it was kept (None: not saved)."""

    result: dict[str, Any]
    path: Optional[Path]


def calibrate(
    ep: Endpoint,
    prompts_path: Optional[str],
    *,
    runs_n: int = 3,
    background: int = 4,
    save: bool = True,
    timeout: float = 60.0,
) -> Calibrated:
    """The endpoint against itself, ``runs_n`` passes with ``background`` streams of other traffic;
    the floor saved for the endpoint's model unless not ``save``."""
    ps = prompts(prompts_path)
    cal = runs.calibrate(ep, ps, runs=runs_n, background=background, timeout=timeout)
    path = store.save_calibration(cal["env"].get("model") or "unknown", cal) if save else None
    return Calibrated(cal, path)


def leak_targets(target: str, load_inventory: LoadInventory, load_config: LoadConfig) -> list[tuple[str, Endpoint]]:
    """``(name, endpoint)`` per target: a URL or one instance as :func:`endpoint` resolves it; instance
    globs (``*?[``, or a comma-separated list) over the inventory's instances and placed replicas.
    Raises ``ClusterctlError`` when the globs match no instance."""
    if is_url(target) or not any(c in target for c in "*?[,"):
        ep = endpoint(target, load_inventory, load_config)
        return [(target if not is_url(target) else ep.url, ep)]
    inv = _deployed(load_inventory, load_config)()
    names = match_instances(sorted(inv.instances), target)
    if not names:
        raise ClusterctlError(
            f"{target!r} matches no instance of {inv.path} (instances: {', '.join(sorted(inv.instances)) or 'none'})"
        )
    return [(n, instance_endpoint(inv, inv.instances[n])) for n in names]


@dataclass(frozen=True)
class LeakResult:
    """One target's leak check: the model its requests named (None: none could be picked) and the report."""

    name: str
    endpoint: Endpoint
    model: Optional[str]
    report: LeakReport

    @property
    def status(self) -> ExitCode:
        """CRIT on any sighting, UNKNOWN when no request was answered, else OK."""
        rep = self.report
        return ExitCode.CRIT if rep.sightings else (ExitCode.UNKNOWN if rep.requests == 0 else ExitCode.OK)


def leak_check(
    targets: list[tuple[str, Endpoint]],
    *,
    sessions: int,
    requests: int,
    model: Optional[str],
    timeout: float,
) -> list[LeakResult]:
    """The context-leak check on each target in turn: ``sessions`` concurrent sessions of ``requests``
    requests each, naming ``model`` (else the one the endpoint lists; asked within 10 s)."""
    results = []
    for name, ep in targets:
        try:
            chosen = leak.pick_model(ep, model, timeout=min(timeout, 10.0))
        except EndpointError as e:
            results.append(LeakResult(name, ep, None, LeakReport(0, 0, 0, errors=[str(e)])))
            continue
        rep = leak.run(ep, sessions=sessions, requests=requests, timeout=timeout, model=chosen)
        results.append(LeakResult(name, ep, chosen, rep))
    return results


def leak_code(results: list[LeakResult]) -> ExitCode:
    """The worst over the targets: CRIT before UNKNOWN before OK."""
    codes = [r.status for r in results]
    return ExitCode.CRIT if ExitCode.CRIT in codes else ExitCode.UNKNOWN if ExitCode.UNKNOWN in codes else ExitCode.OK
