"""``clusterctl status``: every instance's unit, health, versions, GPUs and load.

:func:`collect_status` reads each host once over SSH (the deploy node
program's ``read``: unit states and ``[X-Clusterctl]`` sections), then asks
each active instance, from the control machine, ``/health``, ``/version`` and
``/metrics`` twice ``window`` seconds apart (all instances at once; each HTTP
call times out after ``http_timeout`` seconds).  It takes about ``window`` +
the SSH read + two HTTP timeouts, whatever the number of instances.

Each :class:`InstanceStatus` has a ``state`` and a ``severity`` (the
monitoring verdict, ``clusterctl.diagnose.findings.Severity``):

============  ========  ===================================================
state         severity  meaning
============  ========  ===================================================
serving       OK        unit active, ``/health`` 200 (WARN when the load
                        score is >= ``HIGH_LOAD`` or systemd restarted it)
starting      WARN      activating, or active but not listening yet for
                        less than ``LOADING_GRACE_S`` (vLLM loads for minutes
                        and has no readiness notification)
unhealthy     CRIT      active but ``/health`` fails (503 = engine dead)
hung          CRIT      ``/health`` 200 but requests run in both ``/metrics``
                        samples and no token is generated between them
                        (doctor's hung-engine rule, ``serving.engine_hung``)
restarting    CRIT      between automatic restarts (a crash loop)
failed        CRIT      the unit failed (the message says why, from its journal)
stopped       CRIT      the unit is inactive (why, from its journal)
absent        CRIT      wanted by the inventory, no unit on its host
extra         WARN      a ``clusterctl-*`` unit the inventory does not want
                        (on that host), whatever its state
unknown       UNKNOWN   the host could not be read
============  ========  ===================================================

A multi-node replica (docs/multinode.md) is one row, its head's (``/health`` answers only with
every rank up), with ``members``: each unit (head, then the headless workers ``NAME-nodeR``) with
its host and state (``running``, ``starting``, ``restarting``, ``failed``, ``stopped``, ``absent``,
``unknown``).  A worker that is not running makes the replica at least as bad as that worker
(stopped/failed/restarting/absent: CRIT, starting: WARN, its host unread: UNKNOWN) and the
message names the worker's unit and host; the workers are never ``extra`` rows.

A prefill/decode pool's router (``router-P``, when the caller passes it among ``instances``:
:func:`clusterctl.deploy.status.routers.router_instances`) is a row like an instance's (unit, ``/health``)
with ``pool`` and ``router`` from its own Prometheus page instead of vLLM's load figures: the
router's view of each member's health, its requests and errors so far; a member it sees
unhealthy or does not list, or its page unreadable, makes a serving router WARN
(docs/disaggregation.md).
"""

from __future__ import annotations

import concurrent.futures as cf
from dataclasses import asdict, dataclass, field, replace
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from clusterctl.deploy.units import multinode, pdrouter
from clusterctl.deploy import remote
from clusterctl.deploy.status import routers
from clusterctl.deploy.status.loadscore import InstanceLoad, load_score
from clusterctl.deploy.status.metrics import (
    DEFAULT_HTTP_TIMEOUT,
    MAX_PARALLEL,
    HttpAnswer,
    MetricsSample,
    WindowedMetrics,
    base_url,
    fetch_sample,
    http_get,
    scrape_window,
    version_of,
)
from clusterctl.deploy.status.peaks import load_peaks, update_peaks
from clusterctl.deploy.spec import unit_name
from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.serving import engine_hung, hung_words
from clusterctl.diagnose.unitlog import down_reason
from clusterctl.inventory.model import Instance, Inventory
from clusterctl.diagnose.thresholds import load_thresholds

#: A load score at or above this is reported as high load (WARN).
HIGH_LOAD = 0.6
#: Seconds an active unit may refuse connections before it counts as unhealthy.
LOADING_GRACE_S = 900.0


@dataclass
class InstanceStatus:
    """One instance as status sees it (``None``: not known / not measured).

    ``up_s``: seconds since the unit's main process started.  ``engine_version``:
    the unit's ``EngineVersion=``; ``running_version``: what ``/version`` says.
    ``tokens_per_s``: generation throughput over the window.  ``ttft_p90_s`` /
    ``ttft_mean_s``: time to first token of the requests whose first token came
    within the window (``vllm:time_to_first_token_seconds`` differenced between the
    two samples; ``None`` with one sample or no request).  ``load``: the load
    score (:mod:`clusterctl.deploy.status.loadscore`).  ``gateway_down``: why the
    gateway has it marked down (a drain, an operator), ``None`` when it does not.
    """

    name: str
    host: str | None
    port: int | None
    state: str
    severity: Severity
    message: str = ""
    template: str | None = None
    unit: str = ""
    active: str | None = None
    sub: str | None = None
    restarts: int | None = None
    up_s: float | None = None
    healthy: bool | None = None
    model: str | None = None
    model_version: str | None = None
    engine: str | None = None
    engine_version: str | None = None
    running_version: str | None = None
    gpus: tuple[str, ...] = field(default_factory=tuple)
    kv_usage: float | None = None
    running: float | None = None
    waiting: float | None = None
    tokens_per_s: float | None = None
    ttft_p90_s: float | None = None
    ttft_mean_s: float | None = None
    ttft_requests: float | None = None
    load: float | None = None
    gateway_down: str | None = None
    #: doctor's ``tp.group`` verdict for a group of more than one GPU (``OK``, ``DEGRADED: ...``,
    #: ``UNAVAILABLE: ...``); ``None``: TP 1 or not checked.
    tp_group: str | None = None
    #: A multi-node replica's units: ``{unit, host, rank, state, active, sub}`` per rank, the head first
    #: (see the module doc); empty for a one-host instance.
    members: list[dict[str, Any]] = field(default_factory=list)
    #: A pool's router (``router-P``): its pool, and what its Prometheus page says (deploy/status/routers.py)
    pool: str | None = None
    router: dict[str, Any] | None = None

    @property
    def tp(self) -> int:
        return len(self.gpus)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["severity"] = self.severity.name
        d["gpus"] = list(self.gpus)
        d["tp"] = self.tp
        return d


def exit_code(rows: Iterable[InstanceStatus]) -> int:
    """Monitoring exit code: 0 all serving, 1 some degraded or loaded, 2 some down, 3 could not check.

    Worst by :attr:`Severity.rank` (a WARN outranks a host that could not be read).
    """
    worst = Severity.OK
    for r in rows:
        if r.severity.rank > worst.rank:
            worst = r.severity
    return int(worst)


def max_num_seqs(inst: Instance | None) -> int | None:
    """The instance's ``--max-num-seqs`` from its args (``None``: not set); the gateway's seats too."""
    if inst is None:
        return None
    for key in ("max-num-seqs", "max_num_seqs"):
        v = inst.args.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _gpus(inst: Instance | None, x: Mapping[str, str], host: str | None) -> tuple[str, ...]:
    if inst is not None:
        return tuple(str(g) for g in inst.placement)
    raw = x.get("GPUs", "")
    return tuple(f"{host}:{g.strip()}" for g in raw.replace(" ", ",").split(",") if g.strip())


def _unit_verdict(row: InstanceStatus, health: HttpAnswer | None) -> None:
    """Set state, severity and message from the unit state and ``/health``."""
    if row.active == "active":
        if health is not None and health.ok:
            row.state, row.severity, row.healthy = "serving", Severity.OK, True
            if row.restarts:
                row.severity, row.message = Severity.WARN, f"restarted {row.restarts} time(s) by systemd"
            return
        row.healthy = False
        if health is not None and health.refused and row.up_s is not None and row.up_s < LOADING_GRACE_S:
            row.state, row.severity = "starting", Severity.WARN
            row.message = f"not listening yet after {row.up_s:.0f} s (loading)"
            return
        row.state, row.severity = "unhealthy", Severity.CRIT
        why = "no answer" if health is None else (health.error or f"HTTP {health.status}")
        row.message = f"/health: {why}"
    elif row.active == "activating":
        if row.sub == "auto-restart":
            row.state, row.severity = "restarting", Severity.CRIT
            row.message = f"crashed; systemd restarts it (restarts: {row.restarts or 0})"
        else:
            row.state, row.severity, row.message = "starting", Severity.WARN, f"activating ({row.sub})"
    elif row.active == "failed":
        row.state, row.severity, row.message = "failed", Severity.CRIT, f"unit failed ({row.sub})"
    elif row.active == "deactivating":
        row.state, row.severity, row.message = "stopped", Severity.CRIT, "stopping"
    else:
        row.state, row.severity, row.message = "stopped", Severity.CRIT, f"unit {row.active or 'unknown'}"


#: A member unit's state -> the least severity it gives its replica.
_MEMBER_SEVERITY = {"running": Severity.OK, "starting": Severity.WARN, "unknown": Severity.UNKNOWN}


def _member_state(st: remote.InstanceState | None, hs: remote.HostState | None) -> str:
    if hs is None or hs.error:
        return "unknown"
    if st is None:
        return "absent"
    if st.active == "active":
        return "running"
    if st.active == "activating":
        return "restarting" if st.sub == "auto-restart" else "starting"
    return "failed" if st.active == "failed" else "stopped"


def _members(row: InstanceStatus, inst: Instance, hosts: Mapping[str, remote.HostState]) -> None:
    """Fill a multi-node replica's ``members``; a worker that is not running makes the replica CRIT
    (WARN while it starts, UNKNOWN when its host was not read), the message naming its unit and host."""
    bad: list[str] = []
    for rank, host in enumerate(multinode.hosts_in_order(inst)):
        name = multinode.member_name(inst.name, rank)
        hs = hosts.get(host)
        st = hs.instances.get(name) if hs is not None and not hs.error else None
        state = _member_state(st, hs)
        row.members.append(
            {
                "unit": unit_name(name),
                "host": host,
                "rank": rank,
                "state": state,
                "active": st.active if st else None,
                "sub": st.sub if st else None,
            }
        )
        if rank == 0 or state == "running":
            continue
        why = (
            down_reason(st.journal_tail, st.result, st.exit_status)
            if st is not None and state in ("failed", "stopped", "restarting")
            else ""
        )
        bad.append(f"worker {unit_name(name)} on {host} {state}" + (f" ({why})" if why else ""))
        sev = _MEMBER_SEVERITY.get(state, Severity.CRIT)
        if row.severity.rank < sev.rank:
            row.severity = sev
    if bad:
        row.message = "; ".join(bad) + (f"; {row.message}" if row.message else "")


def _apply_load(row: InstanceStatus, w: WindowedMetrics | None, queue_cap: int | None, capacity: float | None) -> None:
    s: MetricsSample | None = w.last if w else None
    if s is not None:
        row.kv_usage, row.running, row.waiting = s.kv_usage, s.running, s.waiting
        row.tokens_per_s = None if w is None or w.tokens_per_s is None else round(w.tokens_per_s, 2)
        if w is not None:
            p90, mean = w.ttft_p90_s, w.ttft_mean_s
            row.ttft_p90_s = None if p90 is None else round(p90, 4)
            row.ttft_mean_s = None if mean is None else round(mean, 4)
            row.ttft_requests = w.ttft_requests
    hung = None
    if (
        row.state == "serving"
        and w is not None
        and w.first is not None
        and w.last is not None
        and w.first is not w.last
    ):
        a, b = w.first, w.last
        hung = engine_hung(
            a.running,
            b.running,
            a.generation_tokens,
            b.generation_tokens,
            a.waiting,
            b.waiting,
            a.prompt_tokens,
            b.prompt_tokens,
        )
    if hung and w is not None and w.first is not None and w.last is not None:
        row.state, row.severity = "hung", Severity.CRIT
        what = (
            f"{w.last.running:.0f} request(s) running, no token generated"
            if hung == "running"
            else hung_words(hung, w.last.running, w.last.waiting)
        )
        row.message = f"engine hung: {what} in {w.last.at - w.first.at:.1f} s (/health still answers)"
    if row.healthy is None:
        return
    cap = max(capacity or 0.0, row.tokens_per_s or 0.0) or None
    row.load = load_score(
        InstanceLoad(
            healthy=bool(row.healthy),
            kv_usage=row.kv_usage,
            running=row.running,
            waiting=row.waiting,
            tokens_per_s=row.tokens_per_s,
            queue_cap=queue_cap,
            capacity_tokens_per_s=cap,
        )
    )
    if row.healthy and s is None:
        _at_least_warn(row, f"/metrics: {w.error if w else 'not read'}")
    elif row.state == "serving" and row.load >= HIGH_LOAD:
        _at_least_warn(row, f"high load ({row.load:.2f})")


def _at_least_warn(row: InstanceStatus, why: str) -> None:
    if row.severity.rank < Severity.WARN.rank:
        row.severity = Severity.WARN
    row.message = row.message or why


def collect_status(
    inv: Inventory,
    instances: Mapping[str, Instance],
    fleet: Any,
    *,
    window: float = 10.0,
    http_timeout: float = DEFAULT_HTTP_TIMEOUT,
    state_dir: Path | None = None,
    include_extra: bool = True,
    marked_down: Mapping[str, str] | None = None,
    on_event: Callable[[str], None] | None = None,
    tp_check: bool = True,
) -> list[InstanceStatus]:
    """Status of ``instances`` (name → Instance: the inventory's and placed replicas).

    ``fleet`` must hold every host the instances are on (and any other host
    whose ``clusterctl-*`` units should be listed as ``extra`` when
    ``include_extra``).  ``window``: seconds between the two ``/metrics``
    samples (0: one sample, no throughput).  ``state_dir``: where
    throughput peaks are kept (``None``: none kept; the throughput term then
    uses this run's rate as the capacity).  ``marked_down``: instance → reason
    for those the gateway keeps out (a serving one is then WARN: it gets no
    traffic).  ``tp_check``: for every instance with a GPU placement (TP 1
    too), doctor's ``tp.group`` check (:func:`tp_health`, one more round trip per such host)
    fills ``tp_group``; an UNAVAILABLE group that still answers is CRIT (it
    cannot serve), a DEGRADED one at least WARN.  Rows come sorted by host,
    then name.
    """
    say = on_event or (lambda s: None)
    hosts = remote.read_hosts(fleet)
    # (worker unit name, host) -> its replica: the workers of multi-node replicas are members, not extra rows
    workers = {
        (multinode.member_name(n, r), h): n
        for n, i in instances.items()
        if multinode.is_multinode(i)
        for r, h in enumerate(multinode.hosts_in_order(i))
        if r
    }
    now_up = _uptimes(fleet)
    rows: dict[str, InstanceStatus] = {}
    unit_states: dict[str, remote.InstanceState] = {}
    for name, inst in instances.items():
        host = inst.placement[0].host if inst.placement else None
        hs = hosts.get(host) if host else None
        row = InstanceStatus(
            name,
            host,
            inst.port,
            "absent",
            Severity.CRIT,
            template=inst.template,
            unit=unit_name(name),
            model=inst.model,
            engine=inst.engine,
            gpus=_gpus(inst, {}, host),
        )
        if hs is None:
            row.state, row.severity, row.message = "unknown", Severity.UNKNOWN, "host not read"
        elif hs.error:
            row.state, row.severity, row.message = "unknown", Severity.UNKNOWN, hs.error
        elif name not in hs.instances:
            row.message = f"no {unit_name(name)} on {host}"
        rows[name] = row
    for host, hs in hosts.items():
        for name, st in hs.instances.items():
            if (name, host) in workers:
                continue
            wanted = instances.get(name)
            if wanted is not None and (not wanted.placement or wanted.placement[0].host != host):
                wanted = None  # the inventory wants it elsewhere: this copy is extra
            if wanted is None and not include_extra:
                continue
            key = name if wanted is not None else f"{name}@{host}"
            row = rows.get(key) or InstanceStatus(
                name,
                host,
                _int(st.x.get("Port")),
                "extra",
                Severity.WARN,
                unit=unit_name(name),
                gpus=_gpus(None, st.x, host),
            )
            row.active, row.sub, row.restarts = st.active, st.sub, st.restarts
            unit_states[key] = st
            up = now_up.get(host)
            if st.started_mono and up is not None and st.active in ("active", "activating", "deactivating"):
                row.up_s = max(0.0, round(up - st.started_mono / 1e6, 1))
            row.model = st.x.get("Model") or row.model
            row.model_version = st.x.get("ModelVersion") or None
            row.engine = st.x.get("Engine") or row.engine
            row.engine_version = st.x.get("EngineVersion") or None
            rows[key] = row
    urls = {
        k: _url(inv, r, instances.get(r.name))
        for k, r in rows.items()
        if r.active in ("active", "deactivating") and r.port
    }
    say(f"{len(urls)} active instance(s): /health, /version, /metrics over {window:g} s")
    health, versions = _health_and_version(urls, http_timeout)
    # a pool's router has its own Prometheus page (its port, vllm-router's names: deploy/status/routers.py)
    pools = {k for k in rows if k in instances and pdrouter.pool_of(inv, k) is not None}
    engines = {k: u for k, u in urls.items() if k not in pools}
    windows = scrape_window(engines, window=window, fetch=lambda u: fetch_sample(u, http_timeout)) if engines else {}
    router_pages = routers.read_metrics(inv, [k for k in pools if k in urls], http_timeout)
    peaks = load_peaks(state_dir) if state_dir else {}
    for key, row in rows.items():
        if row.active is None:
            continue
        extra = row.state == "extra"
        _unit_verdict(row, health.get(key))
        ust = unit_states.get(key)
        if ust is not None and row.state in ("failed", "stopped", "restarting") and row.active != "deactivating":
            row.message = f"{row.message}: {down_reason(ust.journal_tail, ust.result, ust.exit_status)}"
        if extra:  # not wanted (here): worth a look, never an outage
            row.message = f"not wanted on {row.host} by the inventory; " + (row.message or row.state)
            row.state, row.severity = "extra", Severity.WARN
        row.running_version = versions.get(key)
        if key in pools:
            routers.apply_status(row, inv, instances, router_pages.get(key))
        elif row.active == "active":
            wanted_inst = instances.get(row.name) if key == row.name else None
            _apply_load(row, windows.get(key), max_num_seqs(wanted_inst), peaks.get(row.name))
    for name, inst in instances.items():
        if multinode.is_multinode(inst) and name in rows:
            _members(rows[name], inst, hosts)
    # Every placed instance is a group, TP 1 included: a lost GPU (XID 79) takes a one-GPU
    # instance out as surely as a member of a larger group, while its /health may still answer.
    groups = {n: i for n, i in instances.items() if i.placement and n not in pools}
    if tp_check and groups:
        say(f"{len(groups)} instance(s): doctor's tp.group check of their GPUs")
        for name, verdict in tp_health(inv, groups, fleet, on_event).items():
            tp_row = rows.get(name)
            if tp_row is None:
                continue
            tp_row.tp_group = verdict
            if verdict == "OK":
                continue
            tp_row.message = f"TP group {verdict}" + (f"; {tp_row.message}" if tp_row.message else "")
            bad = (
                Severity.CRIT
                if verdict.startswith("UNAVAILABLE")
                else Severity.WARN
                if verdict.startswith("DEGRADED")
                else Severity.OK
            )
            if tp_row.severity.rank < bad.rank:
                tp_row.severity = bad
    for row in rows.values():
        if marked_down and row.name in marked_down and row.state != "extra":
            row.gateway_down = marked_down[row.name] or "marked down"
            if row.state == "serving":
                _at_least_warn(row, f"marked down at the gateway ({row.gateway_down}): no traffic")
    if state_dir:
        update_peaks(state_dir, {r.name: r.tokens_per_s for r in rows.values() if r.state == "serving"})
    return sorted(rows.values(), key=lambda r: (r.host or "", r.name))


def tp_health(
    inv: Inventory, instances: Mapping[str, Instance], fleet: Any, on_event: Callable[[str], None] | None = None
) -> dict[str, str]:
    """Instance -> ``OK``, ``DEGRADED: ...`` or ``UNAVAILABLE: ...``: doctor's ``tp.group`` check
    over a fresh snapshot of the instances' hosts (``fleet`` must hold them)."""
    # start-up: the CLI's --help reaches this module (ops.gateway -> gateway.render); the bundle
    # brings the probe's collector and the evidence parsers
    from clusterctl.diagnose import bundle
    from clusterctl.diagnose.tp import check_tp_groups
    from clusterctl.probe import snapshot

    hosts = [inv.hosts[h] for h in sorted({g.host for i in instances.values() for g in i.placement}) if h in inv.hosts]
    snap = snapshot.gather(fleet, inv, hosts, on_event=on_event)
    findings = check_tp_groups(bundle.context(snap, replace(inv, instances=dict(instances)), load_thresholds()))
    out: dict[str, str] = {}
    for f in findings:
        name = f.subject.removeprefix("tp-group:")
        if f.check != "tp.group" or name not in instances:
            continue
        if f.severity == Severity.OK:
            out[name] = "OK"
        elif f.severity == Severity.CRIT:
            out[name] = f"UNAVAILABLE: {f.message}"
        elif f.severity == Severity.WARN:
            out[name] = f"DEGRADED: {f.message}"
        else:
            out[name] = f"not checked: {f.message}"
    return out


def _int(v: str | None) -> int | None:
    return int(v) if v and v.isdigit() else None


def _url(inv: Inventory, row: InstanceStatus, inst: Instance | None) -> str:
    if inst is not None:
        return base_url(inv, inst)
    h = inv.hosts.get(row.host or "")
    return f"http://{h.address if h else row.host}:{row.port}"


def _health_and_version(urls: Mapping[str, str], timeout: float) -> tuple[dict[str, HttpAnswer], dict[str, str]]:
    if not urls:
        return {}, {}
    keys = list(urls)
    with cf.ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, 2 * len(keys))) as pool:
        hf = {k: pool.submit(http_get, urls[k] + "/health", timeout) for k in keys}
        vf = {k: pool.submit(http_get, urls[k] + "/version", timeout) for k in keys}
        health = {k: f.result() for k, f in hf.items()}
        versions = {k: v for k, f in vf.items() if (v := version_of(f.result())) is not None}
    return health, versions


def _uptimes(fleet: Any) -> dict[str, float]:
    """Each host's monotonic clock (s since boot, ``/proc/uptime``): turns unit start times into ages."""
    out: dict[str, float] = {}
    for r in fleet.run("cat /proc/uptime", timeout=15):
        try:
            out[r.host] = float((r.stdout or "").split()[0])
        except (ValueError, IndexError):
            pass
    return out


def match_instances(names: Iterable[str], pattern: str | None) -> list[str]:
    """The names a pattern selects, in the given order.

    ``pattern``: comma-separated shell globs (``qwen-*,llama-1``); ``None``,
    ``all`` or ``*`` select everything.  A ``!glob`` term removes matches.
    """
    names = list(names)
    if pattern is None or pattern.strip() in ("", "all", "*"):
        return names
    terms = [t.strip() for t in pattern.split(",") if t.strip()]
    keep = [t for t in terms if not t.startswith("!")]
    drop = [t[1:] for t in terms if t.startswith("!")]
    return [
        n
        for n in names
        if (not keep or any(fnmatchcase(n, k) for k in keep)) and not any(fnmatchcase(n, d) for d in drop)
    ]
