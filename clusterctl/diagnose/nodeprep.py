"""What ``clusterctl node setup`` converges, checked on the facts (``node_prereqs``, docs/facts.md).

Check ``node.prereqs``, per host of the inventory whose facts carry the section (a
collector older than this check: nothing said, never OK):

- each kernel parameter node setup wants on the host (its defaults by the facts,
  then the inventory's ``vars.sysctl``: ``bringup.nodesetup.wanted_sysctls``):
  a value now other than the wanted one — WARN; right now but missing or
  different in ``/etc/sysctl.d/90-clusterctl.conf`` (lost at the next boot) —
  WARN; a parameter the probe did not read (not one of node setup's defaults and
  not in its drop-in: node setup never set it here) — WARN; one the kernel does
  not have (no ``/proc/sys`` file) — UNKNOWN;
- the service user's ``memlock`` (unlimited) and ``nofile`` (at least node
  setup's) in limits.conf / limits.d as pam_limits reads them (the user's own
  lines over ``*``; the later line of a domain wins), where the user exists on
  the host: less — WARN (sessions as that user, ``sudo -u vllm`` or benchmarks
  by hand, cannot register RDMA memory; units keep their own ``LimitMEMLOCK=``,
  ``prereqs.memlock``).

Every WARN ends its action with the ``clusterctl node setup --hosts 'HOST'`` that
converges it.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from clusterctl.bringup.nodesetup import SYSCTL_PATH, limits_path, wanted_sysctls
from clusterctl.deploy.units.render import UnitPolicy
from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.diagnose.registry import AnalysisContext, analyzer
from clusterctl.errors import ClusterctlError
from clusterctl.probe.factgroups import LimitLine, NodePrereqsFact, limit_line

CHECK = "node.prereqs"


def fix_command(host: str) -> str:
    return f"; `clusterctl node setup --hosts '{host}'` converges it (--plan first shows the changes)"


def effective_limit(entries: Iterable[LimitLine | Mapping[str, Any]], user: str, item: str) -> dict[str, str | None]:
    """pam_limits' soft and hard ``item`` of ``user`` from limits.conf entries (typed, or their JSON)
    in reading order: the user's own lines over the ``*`` ones, the later line of a domain over the
    earlier (``-`` sets both).  Group (``@g``) and range domains are not resolved (the probe does not
    read group membership)."""
    out: dict[str, dict[str, str | None]] = {"user": {"soft": None, "hard": None}, "*": {"soft": None, "hard": None}}
    for raw in entries:
        e = raw if isinstance(raw, LimitLine) else limit_line(raw)
        if e.item != item or e.domain not in (user, "*"):
            continue
        slot = out["user" if e.domain == user else "*"]
        for t in ("soft", "hard"):
            if e.type in (t, "-"):
                slot[t] = e.value
    return {t: out["user"][t] if out["user"][t] is not None else out["*"][t] for t in ("soft", "hard")}


def _unlimited(v: str | None) -> bool:
    return v is not None and v.lower() in ("unlimited", "infinity", "-1")


def _at_least(v: str | None, want: int) -> bool:
    if _unlimited(v):
        return True
    try:
        return v is not None and int(v) >= want
    except ValueError:
        return False


@analyzer(CHECK)
def check_node_prereqs(ctx: AnalysisContext) -> list[Finding]:
    inv = ctx.inventory
    if inv is None:
        return []
    out: list[Finding] = []
    for host in sorted(ctx.facts):
        facts = ctx.facts[host] or {}
        sec = ctx.fact(host, NodePrereqsFact)
        if sec is None or not sec.read or host not in inv.hosts:
            continue
        h = inv.hosts[host]
        bad: list[Finding] = []
        try:
            wanted = wanted_sysctls(h, facts)
        except ClusterctlError as e:
            out.append(Finding(CHECK, Severity.UNKNOWN, host, "sysctl", f"{host}: {e}", "fix the inventory"))
            continue
        now = sec.sysctl
        dropin = sec.sysctl_dropin
        for key, want in sorted(wanted.items()):
            subject = f"sysctl:{key}"
            if key not in now:
                bad.append(
                    Finding(
                        CHECK,
                        Severity.WARN,
                        host,
                        subject,
                        f"{host}: kernel parameter {key} (the inventory wants {want}) is not in "
                        f"{SYSCTL_PATH}: node setup has not set it here",
                        f"set {key} = {want} and keep it in {SYSCTL_PATH}" + fix_command(host),
                    )
                )
            elif now[key] is None:
                bad.append(
                    Finding(
                        CHECK,
                        Severity.UNKNOWN,
                        host,
                        subject,
                        f"{host}: kernel parameter {key}: no /proc/sys/{key.replace('.', '/')} here",
                        "check the name in the inventory's vars.sysctl (or the kernel's module)",
                    )
                )
            elif now[key] != want:
                bad.append(
                    Finding(
                        CHECK,
                        Severity.WARN,
                        host,
                        subject,
                        f"{host}: kernel parameter {key} = {now[key]}; the inventory wants {want}",
                        f"sysctl -w {key}={want} and keep it in {SYSCTL_PATH}" + fix_command(host),
                        (f"{key} = {now[key]}",),
                    )
                )
            elif dropin is None or dropin.get(key) != want:
                kept = "no such file" if dropin is None else f"it has {dropin[key]}" if key in dropin else "not in it"
                bad.append(
                    Finding(
                        CHECK,
                        Severity.WARN,
                        host,
                        subject,
                        f"{host}: kernel parameter {key} = {want} now, but {SYSCTL_PATH} does not keep "
                        f"it ({kept}): lost at the next boot",
                        f"keep {key} = {want} in {SYSCTL_PATH}" + fix_command(host),
                    )
                )
        user = str(h.vars.get("service_user") or UnitPolicy().user)
        if user in sec.users:
            entries = sec.limits
            mem = effective_limit(entries, user, "memlock")
            nofile = effective_limit(entries, user, "nofile")
            want_nofile = UnitPolicy().limit_nofile
            if not (_unlimited(mem["soft"]) and _unlimited(mem["hard"])):
                bad.append(
                    Finding(
                        CHECK,
                        Severity.WARN,
                        host,
                        f"limits:{user}",
                        f"{host}: service user {user}: memlock soft {mem['soft'] or 'not set'}, hard "
                        f"{mem['hard'] or 'not set'} in limits.conf, not unlimited: its sessions (sudo -u "
                        f"{user}, benchmarks by hand) cannot register RDMA memory",
                        f"{user} - memlock unlimited in {limits_path(user)}" + fix_command(host),
                    )
                )
            if not (_at_least(nofile["soft"], want_nofile) and _at_least(nofile["hard"], want_nofile)):
                bad.append(
                    Finding(
                        CHECK,
                        Severity.WARN,
                        host,
                        f"limits:{user}:nofile",
                        f"{host}: service user {user}: nofile soft {nofile['soft'] or 'not set'}, hard "
                        f"{nofile['hard'] or 'not set'}, below {want_nofile}",
                        f"{user} - nofile {want_nofile} in {limits_path(user)}" + fix_command(host),
                    )
                )
        out += bad
        if not bad:
            out.append(
                Finding(
                    CHECK,
                    Severity.OK,
                    host,
                    "host",
                    f"{host}: kernel parameters and {user}'s limits as node setup sets them",
                )
            )
    return out
