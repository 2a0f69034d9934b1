"""The difference between what hosts should run and what they have (pure, no I/O).

Per host, every instance is one of:

* ``new``: desired, no unit on the host;
* ``changed``: the host's digest (unit + env) differs; carries a unified diff
  of the unit and the env changes with secret values shown as ``***``;
* ``start``: files equal but the unit is not active (it will be started);
* ``unchanged``: files equal and active: nothing is touched;
* ``remove``: a ``clusterctl-*`` unit on a selected host that is no longer
  desired (with an instance pattern, only matching instances are considered).

A host that could not be read has ``error`` set and no items: nothing is
applied to it.
"""

from __future__ import annotations

import difflib
import fnmatch
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, Sequence

from clusterctl.deploy import spec
from clusterctl.node.deploy import env_hashes
from clusterctl.deploy.remote import HostState, InstanceState

Action = Literal["new", "changed", "start", "unchanged", "remove"]
#: Actions that change a host (everything but ``unchanged``).
CHANGING: frozenset[str] = frozenset({"new", "changed", "start", "remove"})


@dataclass
class EnvChange:
    """One env variable that differs: ``op`` is ``+`` (added), ``-`` (removed) or ``~`` (changed).

    ``shown`` is the new value, or ``***`` for a secret (``None`` for removals).
    """

    key: str
    op: Literal["+", "-", "~"]
    shown: str | None

    def __str__(self) -> str:
        return f"{self.op}{self.key}" + (f"={self.shown}" if self.shown is not None else "")


@dataclass
class PlanItem:
    instance: str
    host: str
    action: Action
    digest: str | None = None
    old_digest: str | None = None
    unit_diff: str = ""
    env_changes: list[EnvChange] = field(default_factory=list)
    state: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "host": self.host,
            "action": self.action,
            "digest": self.digest,
            "old_digest": self.old_digest,
            "state": self.state,
            "unit_diff": self.unit_diff,
            "env_changes": [str(c) for c in self.env_changes],
        }


@dataclass
class HostPlan:
    host: str
    items: list[PlanItem] = field(default_factory=list)
    error: str | None = None

    @property
    def changes(self) -> list[PlanItem]:
        return [i for i in self.items if i.action in CHANGING]

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "error": self.error, "items": [i.to_dict() for i in self.items]}


@dataclass
class Plan:
    hosts: list[HostPlan]
    #: One line per multi-node replica the plan starts or restarts: the order its units go in
    #: (``multinode.phased``: stop all members, start the workers, then the head).
    order: list[str] = field(default_factory=list)
    #: One line per replica across hosts (``nodes: N`` template) placed by this deploy: its hosts and GPUs
    #: per stage, its port and why those hosts (placement/nodes.py).
    placed: list[str] = field(default_factory=list)

    @property
    def pending(self) -> bool:
        """True when applying would change something (or a host could not be read)."""
        return any(h.changes or h.error for h in self.hosts)

    def counts(self) -> dict[str, int]:
        out = {a: 0 for a in ("new", "changed", "start", "unchanged", "remove")}
        for h in self.hosts:
            for i in h.items:
                out[i.action] += 1
        return out

    def changed_hosts(self) -> list[str]:
        return [h.host for h in self.hosts if h.changes]

    def to_dict(self) -> dict[str, Any]:
        out = {"pending": self.pending, "counts": self.counts(), "hosts": [h.to_dict() for h in self.hosts]}
        if self.order:
            out["order"] = list(self.order)
        if self.placed:
            out["placed"] = list(self.placed)
        return out


def matches(instance: str, pattern: str | None) -> bool:
    """``--instances``: comma-separated shell globs (``qwen-*,llama-a``); ``None`` matches all."""
    if not pattern:
        return True
    return any(fnmatch.fnmatchcase(instance, p.strip()) for p in pattern.split(",") if p.strip())


def unit_diff(host: str, old: str, new: str, instance: str) -> str:
    """Unified diff of a unit file (units carry no secrets)."""
    path = spec.unit_path(instance)
    return "".join(
        difflib.unified_diff(
            old.splitlines(True), new.splitlines(True), fromfile=f"{host}:{path}", tofile=f"desired:{path}"
        )
    )


def _env_pairs(env_text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in env_text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() and not key.lstrip().startswith("#"):
            out[key.strip()] = value
    return out


def env_changes(desired_env: str, secret_keys: Iterable[str], have: dict[str, str], salt: str) -> list[EnvChange]:
    """Env keys that differ, compared through the node's salted hashes (values never come back)."""
    secret = set(secret_keys)
    want = _env_pairs(desired_env)
    want_h = env_hashes(desired_env, salt)
    out: list[EnvChange] = []
    for k in sorted(set(want) | set(have)):
        if k not in have:
            out.append(EnvChange(k, "+", "***" if k in secret else want[k]))
        elif k not in want:
            out.append(EnvChange(k, "-", None))
        elif want_h.get(k) != have[k]:
            out.append(EnvChange(k, "~", "***" if k in secret else want[k]))
    return out


def _item(r: spec.RenderedInstance, st: InstanceState | None, salt: str) -> PlanItem:
    if st is None:
        return PlanItem(
            r.instance,
            r.host,
            "new",
            r.digest,
            None,
            unit_diff(r.host, "", r.unit_text, r.instance),
            env_changes=env_changes(r.env_text, r.secret_keys, {}, salt),
        )
    if st.digest != r.digest:
        return PlanItem(
            r.instance,
            r.host,
            "changed",
            r.digest,
            st.digest,
            unit_diff(r.host, st.unit_text, r.unit_text, r.instance),
            env_changes(r.env_text, r.secret_keys, st.env_hashes, salt),
            state=st.active,
        )
    action: Action = "unchanged" if st.active in ("active", "activating", "reloading") else "start"
    return PlanItem(r.instance, r.host, action, r.digest, st.digest, state=st.active)


def make_plan(
    desired: Sequence[spec.RenderedInstance],
    states: dict[str, HostState],
    hosts: Sequence[str],
    instances: str | None = None,
) -> Plan:
    """Diff ``desired`` against ``states`` on ``hosts`` (in that order).

    Only instances matching ``instances`` are considered, desired or on the
    host.  A desired instance on a host outside ``hosts`` is ignored.
    """
    plans: list[HostPlan] = []
    for host in hosts:
        st = states.get(host)
        if st is None or st.error:
            plans.append(HostPlan(host, error=(st.error if st else "not read")))
            continue
        want = [r for r in desired if r.host == host and matches(r.instance, instances)]
        items = [_item(r, st.instances.get(r.instance), st.salt) for r in want]
        wanted = {r.instance for r in want}
        all_desired = {r.instance for r in desired if r.host == host}
        for name, have in sorted(st.instances.items()):
            if name not in wanted and name not in all_desired and matches(name, instances):
                items.append(PlanItem(name, host, "remove", None, have.digest, state=have.active))
        plans.append(HostPlan(host, items))
    return Plan(plans)


def render_text(plan: Plan) -> str:
    """The diffs of a plan as text: per changed instance its unit diff and env changes."""
    out: list[str] = []
    for h in plan.hosts:
        for i in h.items:
            if i.action not in ("new", "changed"):
                continue
            out.append(f"--- {h.host} {i.instance}: {i.action}")
            if i.unit_diff:
                out.append(i.unit_diff.rstrip("\n"))
            if i.env_changes:
                out.append("env: " + " ".join(str(c) for c in i.env_changes))
    return "\n".join(out) + ("\n" if out else "")
