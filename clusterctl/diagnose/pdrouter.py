"""Check ``pd.router``: each prefill/decode pool's router unit (docs/disaggregation.md).

The gateway sends a ready pool's model (a placed prefill and a placed decode member) to the
pool's router only, ``clusterctl-router-P.service`` on ``pd_pools.P.router.host``; when it
is down the model gets no request through the gateway.  From the router host's facts
``units`` (``systemctl show``), as ``serving.unit`` judges an instance's unit:

- ``failed`` or ``inactive``: CRIT, with systemd's result, and the action
  ``clusterctl restart router-P`` (it drains through the pool and waits for its
  ``/health``) or ``clusterctl deploy`` (which renders it again);
- ``activating (auto-restart)``: CRIT, a crash loop;
- other transitions: WARN; active but restarted ``serving.restarts_warn`` times: WARN;
- no unit while the pool is ready: WARN, not deployed (``clusterctl deploy`` renders it);
- active: OK.

A router host whose facts have no ``units`` is UNKNOWN; a host without facts is left to
``host.reachable``.  ``clusterctl status`` adds the router's own view of its members.
"""

from __future__ import annotations

from clusterctl.diagnose import sources
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.diagnose.registry import AnalysisContext, analyzer
from clusterctl.diagnose.thresholds import number, section
from clusterctl.diagnose.unitlog import down_reason
from clusterctl.inventory.model import Inventory, PdPool
from clusterctl.probe.factgroups import UnitsFact

CHECK = "pd.router"


def _ready(inv: Inventory, pool: PdPool) -> bool:
    roles = {i.role for i in sources.instances(inv) if i.model == pool.model and i.placement}
    return {"prefill", "decode"} <= roles


@analyzer(CHECK)
def check_routers(ctx: AnalysisContext) -> list[Finding]:
    inv = ctx.inventory
    if inv is None or not inv.pd_pools:
        return []
    restarts_warn = number(section(ctx.thresholds, "gpu", "serving"), "restarts_warn", 3)
    out: list[Finding] = []
    for pool in inv.pd_pools.values():
        host = pool.router.host
        units = ctx.fact(host, UnitsFact)
        if units is None:
            continue
        name = pool.router_name
        uname, subj = sources.unit_name(name), f"router:{pool.name}"
        what = f"router of pool {pool.name} (model {pool.model}, port {pool.router.port})"
        if not units.read:
            out.append(
                Finding(
                    CHECK,
                    Severity.UNKNOWN,
                    host,
                    subj,
                    f"cannot check the {what}: the host's units were not read (systemctl did not answer)",
                    "run doctor again; check systemctl on the host",
                )
            )
            continue
        unit = next((u for u in units.units if u.unit == uname and u.loaded), None)
        restart = f"clusterctl restart {name} (drains it through the pool, waits for its /health) or clusterctl deploy"
        see = f"journalctl -u {uname} on {host}"
        if unit is None:
            if _ready(inv, pool):
                out.append(
                    Finding(
                        CHECK,
                        Severity.WARN,
                        host,
                        subj,
                        f"{what} not deployed: no {uname} on {host}, and the gateway sends the pool's model to it",
                        "clusterctl deploy (renders and starts the router after its members)",
                    )
                )
            continue
        active, sub = unit.active_state, unit.sub_state
        restarts = unit.restarts
        ev = (f"{uname}: ActiveState={active} SubState={sub} Result={unit.result} NRestarts={restarts}",)
        why = down_reason(
            ctx.raw.get(host, {}).get(f"{name}.log", ""),
            str(unit.result or ""),
            str(unit.exec_main_status or ""),
        )
        if active in ("failed", "inactive"):
            out.append(
                Finding(
                    CHECK,
                    Severity.CRIT,
                    host,
                    subj,
                    f"{what} down: unit {active} ({why}); the pool's model gets no request through the gateway",
                    f"fix the cause ({see}), then {restart}",
                    ev,
                )
            )
        elif active == "activating" and sub == "auto-restart":
            out.append(
                Finding(
                    CHECK,
                    Severity.CRIT,
                    host,
                    subj,
                    f"{what} in a crash loop: between automatic restarts ({restarts} so far; {why})",
                    f"fix the cause ({see}); systemd gives up after its start limit",
                    ev,
                )
            )
        elif active != "active":
            out.append(
                Finding(
                    CHECK,
                    Severity.WARN,
                    host,
                    subj,
                    f"{what}: unit {active} ({sub})",
                    f"check again shortly; {see}",
                    ev,
                )
            )
        elif restarts >= restarts_warn:
            out.append(
                Finding(
                    CHECK,
                    Severity.WARN,
                    host,
                    subj,
                    f"{what} keeps restarting: systemd restarted it {restarts} times ({why})",
                    f"find why it dies ({see}); each restart cuts the streams through it",
                    ev,
                )
            )
        else:
            out.append(Finding(CHECK, Severity.OK, host, subj, f"{what}: unit active ({sub})", evidence=ev))
    return out
