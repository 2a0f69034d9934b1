"""Install the rendered gateway on its hosts: ``clusterctl gateway deploy``.

One SSH command per gateway host runs :mod:`clusterctl.node.gateway` (shipped the one
way node programs are, :mod:`clusterctl.fleet.ship`) with the files as JSON on stdin
(the API key never reaches a command line).  The node writes each file atomically, validates with ``nginx -t`` and keeps the old
files when nginx refuses (its message comes back in
:attr:`GatewayHostResult.error`), reloads gracefully (streams in flight
finish), and reports when ``/gateway/health`` serves the new config.  A host
that has every file already is left alone (``changed=False``).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path
from collections.abc import Callable
from typing import Any

from clusterctl.deploy.remote import node_reply
from clusterctl.deploy.units.secrets import read_secret
from clusterctl.errors import ConfigError, Problem
from clusterctl.fleet import ship
from clusterctl.fleet.fleet import Fleet
from clusterctl.fleet.results import HostResult
from clusterctl.gateway import keys as gwkeys
from clusterctl.gateway.render import RenderedGateway, TlsFiles
from clusterctl.inventory.model import Inventory, SecretRef

#: Seconds one host may take (write, nginx -t, reload, health wait).
APPLY_TIMEOUT_S = 90.0


@dataclass
class GatewayHostResult:
    """One gateway host after apply or status.

    ``changed``: files were written; ``reloaded``: nginx reloaded (``action``
    says ``reloaded`` or ``started``); ``kind`` classifies an error
    (``nginx-t``, ``reload``, ``health``, ``node``, or the SSH status).
    ``active``/``config``: nginx's unit state and the digest its
    ``/gateway/health`` serves (status only).
    """

    host: str
    ok: bool
    changed: bool = False
    reloaded: bool = False
    action: str | None = None
    error: str | None = None
    kind: str | None = None
    active: str | None = None
    config: str | None = None
    #: keepalived (``gateway.vip``): what apply did (``started``, ``reloaded``, ``unchanged``, ``removed``)
    vrrp: str | None = None
    #: status with ``gateway.vip``: keepalived's unit state and whether this host holds the address
    keepalived: str | None = None
    holds_vip: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@lru_cache(maxsize=1)
def _node_program() -> ship.Program:
    """The node program as shipped (:func:`clusterctl.fleet.ship.build`)."""
    return ship.build("gateway")


def _answer(r: HostResult) -> dict[str, Any]:
    """The node program's JSON answer; an SSH failure or crash as ``ok: false`` with the reason."""
    reply = node_reply(r)
    return reply.data if reply.data else {"ok": False, "kind": reply.kind, "error": reply.error}


def _run(fleet: Fleet, hosts: list[str], job: dict[str, Any], timeout: float) -> dict[str, dict[str, Any]]:
    # the host's inventory name is the program's argument (it picks its keepalived files)
    res = ship.run(
        fleet,
        _node_program(),
        {h: [h] for h in hosts},
        stdin=json.dumps(job).encode() + b"\n",
        sudo=True,
        timeout=timeout,
    )
    return {r.host: _answer(r) for r in res}


def apply_gateway(
    fleet: Fleet, rendered: RenderedGateway, *, port: int, hosts: list[str], timeout: float = APPLY_TIMEOUT_S
) -> list[GatewayHostResult]:
    """Install ``rendered`` on ``hosts`` (all held by ``fleet``); one result per host, in order."""
    job = {
        "op": "apply",
        "digest": rendered.config,
        "port": port,
        "runtime": rendered.runtime,
        "files": [
            {"path": f.path, "text": None if f.remove else f.text, "mode": f.mode, "group": f.group, "live": f.live}
            for f in rendered.files
        ],
        # keepalived's files per host; {} removes a floating address clusterctl set up earlier
        "vrrp": {h: [{"path": f.path, "text": f.text, "mode": f.mode} for f in fs] for h, fs in rendered.vrrp.items()},
    }
    answers = _run(fleet, hosts, job, timeout)
    out = []
    for h in hosts:
        a = answers.get(h, {"ok": False, "kind": "node", "error": "no answer"})
        out.append(
            GatewayHostResult(
                h,
                bool(a.get("ok")),
                bool(a.get("changed")),
                bool(a.get("reloaded")),
                a.get("action"),
                a.get("error"),
                a.get("kind"),
                vrrp=a.get("vrrp"),
            )
        )
    return out


def push_scores(
    fleet: Fleet,
    rendered: RenderedGateway,
    scores: dict[str, Any],
    *,
    port: int,
    hosts: list[str],
    timeout: float = 30.0,
) -> list[GatewayHostResult]:
    """Send the instance scores to every gateway host's admin endpoint (no reload)."""
    answers = _run(
        fleet, hosts, {"op": "scores", "port": port, "token": rendered.runtime["token"], "scores": scores}, timeout
    )
    out = []
    for h in hosts:
        a = answers.get(h, {"ok": False, "kind": "node", "error": "no answer"})
        out.append(
            GatewayHostResult(
                h, bool(a.get("ok")), action="scores" if a.get("ok") else None, error=a.get("error"), kind=a.get("kind")
            )
        )
    return out


def gateway_status(
    fleet: Fleet, *, port: int, hosts: list[str], timeout: float = 30.0, vip: str | None = None
) -> list[GatewayHostResult]:
    """nginx's unit state and the config digest each host serves (``config=None``: no answer); with
    ``vip`` keepalived's state and whether the host holds the floating address."""
    answers = _run(fleet, hosts, {"op": "status", "port": port, "vip": vip}, timeout)
    out = []
    for h in hosts:
        a = answers.get(h, {"ok": False, "kind": "node", "error": "no answer"})
        health = a.get("health") or {}
        ok = bool(a.get("ok")) and a.get("active") == "active" and "config" in health
        error = a.get("error") or (
            None if ok else f"nginx {a.get('active')}; /gateway/health: {health.get('error', health)}"
        )
        if vip and ok and a.get("keepalived") != "active":
            ok, error = False, f"keepalived {a.get('keepalived')}: this host cannot take the floating address"
        out.append(
            GatewayHostResult(
                h,
                ok,
                error=error,
                kind=a.get("kind"),
                active=a.get("active"),
                config=health.get("config"),
                keepalived=a.get("keepalived"),
                holds_vip=a.get("holds_vip"),
            )
        )
    return out


def secret_inputs(inv: Inventory, state_dir: Path) -> dict[str, Any]:
    """What :func:`render_gateway` needs beyond the inventory to write real files: the upstream
    key, the client keys (hashes) and the TLS certificate and key (keyword arguments)."""
    return {
        "api_key": resolve_api_key(inv),
        "clients": gwkeys.load(state_dir),
        "tls": resolve_tls(inv),
        "vrrp_password": resolve_vrrp_password(inv),
    }


def _read_ref(inv: Inventory, ref: SecretRef, what: str, check: Callable[[str], str | None] = lambda v: None) -> str:
    """The value ``ref`` names, read on this machine; a :class:`ConfigError` at the inventory's
    ``file:line`` (never holding the value) when it cannot be read or ``check`` says why not."""
    base = os.path.dirname(os.path.abspath(inv.path)) if inv.path else os.getcwd()
    value, why = read_secret(ref, base)
    if value is not None:
        why = check(value)
    if value is None or why:
        loc = ref.location
        raise ConfigError([Problem(loc.file if loc else inv.path, loc.line if loc else 0, f"{what}: {why}")])
    return value


def resolve_tls(inv: Inventory) -> TlsFiles | None:
    """The certificate and key named by ``gateway.tls`` (``None`` without TLS); errors at ``file:line``."""
    gw = inv.gateway
    if gw is None or gw.tls_certificate is None or gw.tls_key is None:
        return None
    pem = lambda v: None if "-----BEGIN" in v else "not a PEM file (no -----BEGIN line)"
    return TlsFiles(
        _read_ref(inv, gw.tls_certificate, "gateway.tls.certificate", pem) + "\n",
        _read_ref(inv, gw.tls_key, "gateway.tls.key", pem) + "\n",
    )


def resolve_api_key(inv: Inventory) -> str | None:
    """The upstream API key named by ``gateway.api_key`` (``None`` when none is configured).

    Raises :class:`ConfigError` at the inventory's ``file:line`` when it cannot
    be read; the message never holds the value.
    """
    gw = inv.gateway
    if gw is None or gw.api_key is None:
        return None
    return _read_ref(inv, gw.api_key, "gateway.api_key")


def resolve_vrrp_password(inv: Inventory) -> str | None:
    """VRRP's password named by ``gateway.vip.password`` (``None`` without one); errors at ``file:line``."""
    gw = inv.gateway
    if gw is None or gw.vip is None or gw.vip.password is None:
        return None
    return _read_ref(inv, gw.vip.password, "gateway.vip.password", lambda v: None if v.strip() else "empty").strip()
