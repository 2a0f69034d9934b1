"""Render the gateway's nginx files: a pure function of the inventory and the instances' states.

:func:`render_gateway` returns every file nginx reads on a gateway host
(docs/gateway.md has the anatomy):

* ``nginx.conf``: the main context (``worker_shutdown_timeout``, the njs
  module) including ``gateway.conf``;
* ``gateway.conf``: per model an upstream hashed on the session header
  (sticky, no weights) and a least-connections upstream (weights from the
  load score), the limits, the JSON error pages, gray-release and mirror
  splits, ``/gateway/health``;
* ``gateway.js``: the njs router (the model is in the JSON body);
* ``upstream-auth.conf`` (only with ``gateway.api_key``): the
  ``Authorization`` header for the instances, mode 0640 root:www-data.  It is
  the only file that holds a secret; :meth:`RenderedGateway.redacted` hides it.

No I/O: the API key's value is passed in (``None``: rendered as ``***``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined

from clusterctl.deploy.status.metrics import base_url
from clusterctl.deploy.units.pdrouter import gateway_servers
from clusterctl.deploy.status.instances import max_num_seqs
from clusterctl.errors import ClusterctlError
from clusterctl.gateway.keys import ClientKey
from clusterctl.inventory.gateway import served_name
from clusterctl.inventory.model import GatewaySpec, Instance, Inventory

#: Seconds an old worker may keep serving streams after a reload.
WORKER_SHUTDOWN_TIMEOUT_S = 600
#: Seconds to connect to an instance before trying the next one.  Instances are on the LAN,
#: where a connect takes well under a millisecond (the kernel answers the SYN even when the
#: engine is busy): 1 s only passes when the host is gone (no SYN-ACK, no RST).  It must stay
#: below a client's own patience: with nginx's usual 5 s, clients gave up first, so nginx never
#: counted a lost host's instance as failed and kept sending it requests (benchmarks/gateway/
#: host_loss.py, docs/gateway.md).  Only connect errors move a request: a POST that reached an
#: instance is never sent twice (proxy_next_upstream without non_idempotent).
CONNECT_TIMEOUT_S = 1
#: An instance that failed a connect is skipped for this long (nginx's fail_timeout, the
#: upstream zone shares it across workers); then one request tries it again.
FAIL_TIMEOUT_S = 10
#: Largest request body (MiB) the njs router reads into memory.
BODY_MIB = 16
#: Seconds nginx keeps an idle connection to an instance: below vLLM's own 5 s
#: (``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` default in vllm/envs.py, passed to uvicorn's
#: ``timeout_keep_alive``), so nginx closes first and never sends a POST on a
#: connection the engine is closing (a 502 nginx must not retry).
UPSTREAM_KEEPALIVE_S = 4
#: Seats of an instance whose --max-num-seqs is unknown (vLLM's default on GPUs).
DEFAULT_SEATS = 256
#: least_conn weights lie in 1..MAX_WEIGHT.
MAX_WEIGHT = 100
REDACTED = "***"


class GatewayRenderError(ClusterctlError):
    """The inventory asks for something the gateway cannot express."""


@dataclass(frozen=True)
class GatewayPaths:
    """Where the files live on a gateway host (tests render into a temporary directory)."""

    conf_dir: str = "/etc/nginx/clusterctl"
    nginx_conf: str = "/etc/nginx/nginx.conf"
    pid_file: str = "/run/nginx.pid"
    log_dir: str = "/var/log/nginx"
    modules_include: str = "/etc/nginx/modules-enabled/*.conf"
    #: Written by the nginx workers (www-data): the scores file and per-instance pick counters.
    state_dir: str = "/var/lib/clusterctl-gateway"


@dataclass(frozen=True)
class ServerState:
    """How the gateway treats one instance: ``down`` (with ``reason``) or up with a least_conn ``weight``."""

    down: bool = False
    weight: int = MAX_WEIGHT
    reason: str = ""


@dataclass(frozen=True)
class GatewayFile:
    """One file on the gateway host: ``mode`` octal; ``group`` its owner group (owner root).

    ``remove``: the host must not have it (``text`` is empty), e.g. the auth
    file once ``gateway.api_key`` is removed from the inventory.
    """

    path: str
    text: str = field(repr=False)  # the auth file's text is the key: never in a repr or a log
    mode: int = 0o644
    group: str = "root"
    secret: bool = False
    remove: bool = False  # the file must not exist (written by an earlier config)
    live: bool = False  # read by njs per request: a change needs no reload


@dataclass(frozen=True)
class RenderedGateway:
    """The files of one gateway and ``digest``: sha256 of all of them (secret included), hex.

    ``config``: the digest of the files nginx reads at (re)load only, what
    ``/gateway/health`` serves (16 hex); a change of a ``live`` file alone
    (the client keys) changes ``digest`` but not ``config``: no reload.
    """

    files: tuple[GatewayFile, ...]
    digest: str
    servers: dict[str, ServerState] = field(default_factory=dict)
    config: str = ""
    runtime: dict[str, str] = field(default_factory=dict)  # the workers' state dir and the admin token's path
    #: per gateway host, keepalived's files (``gateway.vip``; ``clusterctl.gateway.vrrp``), in ``digest``
    vrrp: dict[str, tuple[GatewayFile, ...]] = field(default_factory=dict)

    def redacted(self) -> tuple[GatewayFile, ...]:
        """The files with the secret one's text replaced: what may be shown or written by ``render``."""
        return tuple(replace(f, text=_redact(f)) if f.secret else f for f in self.files)

    def redacted_vrrp(self) -> dict[str, tuple[GatewayFile, ...]]:
        """keepalived's files per host with the VRRP password replaced."""
        return {h: tuple(replace(f, text=_redact(f)) if f.secret else f for f in fs) for h, fs in self.vrrp.items()}


_AUTH_LINE = 'proxy_set_header Authorization "Bearer {key}";\n'
_KEY_OK = re.compile(r"^[!#%&'()*+,\-./0-9:<=>?@A-Z\[\]^_`a-z|~]+$")


#: An nginx word clusterctl writes bare (server addresses, instance names in the ``map``).
_TOKEN = re.compile(r"^[A-Za-z0-9_.:\[\]-]+$")


def comment_text(value: object) -> str:
    """``value`` for an nginx ``#`` comment: one line, every non-printable character a ``?``.

    The inventory refuses control characters already; the renderer never trusts that
    (a newline in a comment would make the rest of the value live config).
    """
    return "".join(ch if ch == " " or ch.isprintable() else "?" for ch in str(value))


def _token(value: object) -> str:
    text = str(value)
    if not _TOKEN.match(text):
        raise GatewayRenderError(
            f"{text!r} cannot be written into the nginx config as a name or address "
            "(letters, digits, '_', '.', ':', '-', brackets only)"
        )
    return text


def _redact(f: GatewayFile) -> str:
    if f.path.endswith("upstream-auth.conf"):
        return _AUTH_LINE.format(key=REDACTED)
    if f.path.endswith("keepalived.conf"):
        return re.sub(r"(?m)^(\s*auth_pass )\S+$", lambda m: m.group(1) + REDACTED, f.text)
    if f.path.endswith("clients.json"):
        n = len(json.loads(f.text or "{}"))
        return (
            json.dumps(
                {"not shown": f"{n} client key(s): SHA-256 -> name, limit classes (`clusterctl gateway key list`)"}
            )
            + "\n"
        )
    return REDACTED + "\n"


def _clients_file(paths: GatewayPaths) -> str:
    return f"{paths.conf_dir}/clients.json"


def _listen(addr: str, port: int) -> str:
    if not addr:
        return str(port)
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


def _clients(gw: GatewaySpec, clients: list[ClientKey]) -> tuple[list[dict[str, str]], list[dict[str, Any]], str]:
    """(rate zones, stream zones, clients.json): a zone per distinct limit (a new one needs a
    reload, a new key with known limits does not), each key's hash -> name and limit classes."""
    # The inventory's defaults are classes 0 whether or not a key uses them: adding or
    # revoking a key with default limits never changes the config (no reload).
    rates: dict[tuple[float, int], int] = (
        {(gw.key_requests_per_second, gw.key_burst): 0} if gw.key_requests_per_second > 0 else {}
    )
    streams: dict[int, int] = {gw.key_streams: 0} if gw.key_streams > 0 else {}
    table: dict[str, dict[str, Any]] = {}
    for c in sorted(clients, key=lambda c: c.name):
        rps = gw.key_requests_per_second if c.requests_per_second is None else c.requests_per_second
        burst = gw.key_burst if c.burst is None else c.burst
        n = gw.key_streams if c.streams is None else c.streams
        rclass = rates.setdefault((rps, burst), len(rates)) if rps > 0 else "-"
        sclass = streams.setdefault(n, len(streams)) if n > 0 else "-"
        table[c.sha256] = {"name": c.name, "rate": rclass, "streams": sclass}
    rate_zones = [
        {"zone": f"gw_key_rate_{i}", "rate": _rate(rps), "burst": f" burst={burst}" if burst else ""}
        for (rps, burst), i in rates.items()
    ]
    stream_zones = [{"zone": f"gw_key_streams_{i}", "streams": n} for n, i in streams.items()]
    return rate_zones, stream_zones, json.dumps(table, indent=1, sort_keys=True) + "\n"


def _env() -> Environment:
    env = Environment(
        loader=PackageLoader("clusterctl", "templates/gateway"),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["comment"] = comment_text
    env.filters["token"] = _token
    return env


def _slugs(names: list[str]) -> dict[str, str]:
    """Inventory model name -> an nginx-safe upstream name, unique."""
    out: dict[str, str] = {}
    for name in names:
        base = "m_" + re.sub(r"[^A-Za-z0-9_]", "_", name)
        slug, n = base, 2
        while slug in out.values():
            slug, n = f"{base}_{n}", n + 1
        out[name] = slug
    return out


def _percent(p: float) -> str:
    return f"{round(p, 2):g}%"


def _server_address(inv: Inventory, inst: Instance) -> str:
    return base_url(inv, inst).removeprefix("http://")


@dataclass(frozen=True)
class TlsFiles:
    """The certificate (PEM) and its private key, read on the control machine."""

    certificate: str = field(repr=False)
    key: str = field(repr=False)


def render_gateway(
    inv: Inventory,
    instances: Mapping[str, Instance],
    states: Mapping[str, ServerState] | None = None,
    *,
    api_key: str | None = None,
    clients: tuple[ClientKey, ...] | list[ClientKey] = (),
    tls: TlsFiles | None = None,
    paths: GatewayPaths = GatewayPaths(),
    vrrp_password: str | None = None,
) -> RenderedGateway:
    """The gateway's files for ``inv.gateway`` in front of ``instances`` (name -> Instance).

    ``states`` marks instances down or weights them (missing: up, full weight).
    ``api_key`` is the key the instances require when ``gateway.api_key`` is set
    (``None``: written as ``***``, for showing); ``clients`` the client keys
    (hashes: ``clients.conf``, 0600 root); ``tls`` the certificate and key when
    ``gateway.tls`` is set (``None``: written as ``***``).  Raises
    :class:`GatewayRenderError` when the inventory has no gateway or the key
    cannot be written into an nginx header safely (the message never shows it).
    """
    gw = inv.gateway
    if gw is None:
        raise GatewayRenderError(f"{inv.path}: no 'gateway:' section (docs/inventory.md)")
    states = states or {}
    instances = gateway_servers(inv, instances)  # a prefill/decode pool's model goes to its router
    models = [m for m in inv.models if any(i.model == m for i in instances.values())]
    for g in gw.gray:
        models += [m for m in (g.stable, g.canary) if m not in models]
    slugs = _slugs(models)
    upstreams, server_states = _upstreams(inv, gw, instances, states, slugs)
    live = {u["model"] for u in upstreams}
    mirrors = [
        {
            "var": f"gw_mirror_{i}",
            "served": m.served,
            "candidate_model": m.candidate,
            "upstream": slugs[m.candidate],
            "percent_text": _percent(m.percent),
        }
        for i, m in enumerate(gw.mirrors)
        if m.candidate in live and m.percent > 0
    ]
    mirror_of = {m["served"]: m["var"] for m in mirrors}
    for u in upstreams:
        u["mirror"] = mirror_of.get(served_name(inv, u["model"]))
    gray = [
        {
            "var": f"gw_gray_{i}",
            "served": g.served,
            "canary_model": g.canary,
            "stable": g.stable,
            "percent_text": _percent(g.percent),
        }
        for i, g in enumerate(gw.gray)
    ]
    routes = _routes(inv, gw, slugs, live, gray)
    instance_names = sorted((s["address"], s["name"]) for u in upstreams for s in u["servers"])
    auth = gw.auth == "keys"
    rate_zones, stream_zones, clients_text = _clients(gw, list(clients)) if auth else ([], [], "")
    ctx = {
        "inventory": inv.path,
        "paths": paths,
        "session_var": gw.session_header.lower().replace("-", "_"),
        "gray": gray,
        "mirrors": mirrors,
        "upstreams": upstreams,
        "instance_names": instance_names,
        "limits": {
            "connections": gw.max_connections,
            "rate": _rate(gw.requests_per_second),
            "burst": f" burst={gw.burst}" if gw.burst else "",
        },
        "port": gw.port,
        "read_timeout_s": gw.read_timeout_s,
        "connect_timeout_s": CONNECT_TIMEOUT_S,
        "fail_timeout_s": FAIL_TIMEOUT_S,
        "dispatch": gw.dispatch,
        "listen": [_listen(a, p) for a, p in gw.listen_addresses()],
        "admin_port": gw.admin_port,
        "tls": gw.tls_certificate is not None,
        "auth": auth,
        "key_rate_zones": rate_zones,
        "key_stream_zones": stream_zones,
        "upstream_keepalive_s": UPSTREAM_KEEPALIVE_S,
        "body_mib": BODY_MIB,
        "api_key": gw.api_key is not None,
        "worker_shutdown_timeout_s": WORKER_SHUTDOWN_TIMEOUT_S,
        "routes_json": json.dumps(routes, indent=4, sort_keys=True),
        "clients_file_json": json.dumps(_clients_file(paths)),
        "dispatch_json": json.dumps(gw.dispatch),
        "scores_file_json": json.dumps(f"{paths.state_dir}/scores.json"),
        "picks_dir_json": json.dumps(f"{paths.state_dir}/picks"),
        "max_age_ms": 1000 * max(WORKER_SHUTDOWN_TIMEOUT_S, gw.read_timeout_s),
        "admin_token_json": json.dumps(f"{paths.conf_dir}/admin.token"),
        "members_json": json.dumps(
            {
                u["name"]: [
                    {"name": srv["name"], "loc": srv["loc"], "down": srv["down"], "step": srv["step"]}
                    for srv in u["servers"]
                ]
                for u in upstreams
            },
            indent=4,
            sort_keys=True,
        ),
        "session_header_json": json.dumps(gw.session_header),
        "max_conns_json": json.dumps(gw.max_conns),
    }
    env = _env()
    placeholder = "@@CONFIG_DIGEST@@"
    files = [
        GatewayFile(paths.nginx_conf, env.get_template("nginx.conf.j2").render(ctx)),
        GatewayFile(
            f"{paths.conf_dir}/gateway.conf", env.get_template("gateway.conf.j2").render({**ctx, "digest": placeholder})
        ),
        GatewayFile(f"{paths.conf_dir}/gateway.js", env.get_template("gateway.js.j2").render(ctx)),
    ]
    auth_path = f"{paths.conf_dir}/upstream-auth.conf"
    if gw.api_key is not None:
        files.append(GatewayFile(auth_path, _auth_text(api_key), mode=0o640, group="www-data", secret=True))
    else:
        files.append(GatewayFile(auth_path, "", mode=0o640, group="www-data", remove=True))
    files.append(
        GatewayFile(
            _clients_file(paths), clients_text, mode=0o640, group="www-data", secret=True, remove=not auth, live=True
        )
    )
    crt, key = f"{paths.conf_dir}/tls.crt", f"{paths.conf_dir}/tls.key"
    if gw.tls_certificate is not None:
        files.append(GatewayFile(crt, tls.certificate if tls else REDACTED + "\n"))
        files.append(GatewayFile(key, tls.key if tls else REDACTED + "\n", mode=0o600, secret=True))
    else:
        files += [GatewayFile(crt, "", remove=True), GatewayFile(key, "", mode=0o600, remove=True)]
    h, whole = hashlib.sha256(), hashlib.sha256()
    for f in files:
        entry = f"{f.path}\0{f.mode:o}\0{f.group}\0{f.remove}\0{f.text}\0".encode()
        whole.update(entry)
        if not f.live:
            h.update(entry)
    config = h.hexdigest()[:16]
    from clusterctl.gateway.vrrp import render_vrrp  # it builds on this module's GatewayFile

    vrrp = render_vrrp(inv, vrrp_password)
    for host, vfiles in sorted(vrrp.items()):  # keepalived's files: in the digest (sync applies them), not in config
        for f in vfiles:
            whole.update(f"{host}\0{f.path}\0{f.mode:o}\0{f.text}\0".encode())
    files = [replace(f, text=f.text.replace(placeholder, config)) for f in files]
    return RenderedGateway(
        tuple(files),
        whole.hexdigest(),
        server_states,
        config,
        {"state_dir": paths.state_dir, "token": f"{paths.conf_dir}/admin.token"},
        vrrp,
    )


def _rate(rps: float) -> str:
    if rps <= 0:
        return ""
    return f"{int(rps)}r/s" if rps >= 1 and rps == int(rps) else f"{max(1, round(rps * 60))}r/m"


def _auth_text(api_key: str | None) -> str:
    if api_key is None:
        return _AUTH_LINE.format(key=REDACTED)
    if not _KEY_OK.match(api_key):
        raise GatewayRenderError(
            "gateway.api_key: the key holds a character nginx would interpret "
            "(space, quote, backslash, '$', ';', braces) or is empty; use a plain token"
        )
    return _AUTH_LINE.format(key=api_key)


def _upstreams(
    inv: Inventory,
    gw: GatewaySpec,
    instances: Mapping[str, Instance],
    states: Mapping[str, ServerState],
    slugs: dict[str, str],
) -> tuple[list[dict[str, Any]], dict[str, ServerState]]:
    out: list[dict[str, Any]] = []
    used: dict[str, ServerState] = {}
    max_conns = f" max_conns={gw.max_conns}" if gw.max_conns else ""
    for model, slug in slugs.items():
        servers = []
        for name in sorted(n for n, i in instances.items() if i.model == model):
            st = states.get(name, ServerState())
            weight = min(MAX_WEIGHT, max(1, int(st.weight)))
            used[name] = replace(st, weight=weight)
            seats = max_num_seqs(instances[name]) or DEFAULT_SEATS
            servers.append(
                {
                    "name": name,
                    "address": _server_address(inv, instances[name]),
                    "step": round(1.0 / seats, 6),
                    "max_conns": max_conns,
                    "weight": weight,
                    "down": st.down,
                    "reason": re.sub(r"[^\w .:/-]", "", st.reason)[:80],
                }
            )
        if servers:
            for i, srv in enumerate(servers):  # least_score: one upstream per instance, the others as backups
                srv["loc"] = f"{slug}_i{i}"
                # the next ones first (each lost instance's requests go to a different neighbour),
                # those on other hosts before those on its own (a lost host takes all of its own)
                host = str(srv["address"]).rsplit(":", 1)[0]
                rot = servers[i + 1 :] + servers[:i]
                far = [o for o in rot if str(o["address"]).rsplit(":", 1)[0] != host]
                near = [o for o in rot if str(o["address"]).rsplit(":", 1)[0] == host]
                k = i % len(far) if far else 0
                srv["backups"] = [{"address": o["address"], "down": o["down"]} for o in far[k:] + far[:k] + near]
            out.append({"model": model, "name": slug, "servers": servers, "mirror": None})
    return out, used


def _routes(
    inv: Inventory, gw: GatewaySpec, slugs: dict[str, str], live: set[str], gray: list[dict[str, str]]
) -> dict[str, dict[str, str | None]]:
    """Served name -> {upstream, gray variable, canary upstream}; ``None`` upstream: no instance."""
    routes: dict[str, dict[str, str | None]] = {}
    for model in inv.models:
        served = served_name(inv, model)
        if served in routes:
            continue  # the first model with a served name answers it; gray releases split further
        routes[served] = {"upstream": slugs[model] if model in live else None}
    for g in gray:
        routes[g["served"]] = {
            "upstream": slugs[g["stable"]] if g["stable"] in live else None,
            "gray": g["var"],
            "canary": slugs[g["canary_model"]] if g["canary_model"] in live else None,
        }
    return routes
