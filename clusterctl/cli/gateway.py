"""``clusterctl gateway render | deploy | sync | status``: nginx in front of the instances.

docs/gateway.md has the configuration's anatomy.  Exit codes: 0 OK; 1 sync
changed nothing because the interval has not passed (``--json`` says when);
2 a gateway host failed (nginx -t refused, reload failed, unreachable);
3 usage or configuration errors.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from clusterctl.cli._common import InventoryOpt, JsonOpt, console, err_console, fail, load_inventory, print_json
from clusterctl.cli._hosts import (
    AskBecomePassOpt,
    ConnectTimeoutOpt,
    FanoutOpt,
    HostKeyOpt,
    host_fleets,
    instances_wanted,
)
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import ExitCode

# The workflow (and the gateway and deploy packages under it) is imported by each command when it
# runs, so that `clusterctl --help` and completion stay light (about 0.35 s of CPU less).
if TYPE_CHECKING:
    from clusterctl.ops import gateway as gwops

app = typer.Typer(
    help="Render, deploy and sync the nginx gateway in front of the instances (docs/gateway.md).",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,
)

StateDirOpt = typer.Option(
    None,
    "--state-dir",
    help="Deploy state directory (placements, gateway state) "
    "[default: $CLUSTERCTL_STATE_DIR, then the user state dir]/deploy.",
)


def _request(
    inventory: Optional[str],
    state_dir: Optional[str],
    hosts: Optional[Callable[[gwops.GatewayRequest], list[str]]] = None,
    **fleet_opts: Any,
) -> gwops.GatewayRequest:
    """The workflow's request: the inventory loaded (with a ``gateway:`` section), the state
    directory resolved and, given ``hosts`` (the host names the command reaches), how its
    fleets are built (the sudo password read once); exits 3 on a problem."""
    from clusterctl.ops import gateway as gwops

    inv = load_inventory(inventory)
    if inv.gateway is None:
        fail(f"{inv.path}: no 'gateway:' section (docs/inventory.md)")
    request = gwops.GatewayRequest(inv, instances_wanted(inv, state_dir)[1])
    try:
        if hosts is None:
            return request
        return replace(request, fleets=host_fleets(inv, hosts(request), **fleet_opts))
    except ClusterctlError as e:
        fail(str(e))


def _host_rows(results: list[gwops.GatewayHostResult]) -> None:
    from rich.markup import escape

    for r in results:
        if r.ok:
            what = r.action or ("unchanged" if not r.changed else "written")
            extra = f"; keepalived {r.vrrp}" if r.vrrp else ""
            if r.keepalived:
                extra += f"; keepalived {r.keepalived}" + ("; holds the floating address" if r.holds_vip else "")
            console.print(
                f"[green]ok[/] {escape(r.host)}: {escape(what)}"
                + (f" (config {escape(r.config)}, nginx {escape(r.active or '?')})" if r.config else "")
                + escape(extra)
            )
        else:
            console.print(f"[bold red]FAILED[/] {escape(r.host)}: {escape(r.error or r.kind or 'failed')}")


@app.command(
    "render",
    help="""Render the gateway's nginx files and print them, or write them under --out.

The upstream API key (gateway.api_key) is never printed or written by render:
its file shows ***. Instances are all up at full weight unless --from-state
uses the states the last `gateway sync` decided.

Examples:

  clusterctl gateway render -i inventory.yaml

  clusterctl gateway render --out /tmp/gw --from-state
""",
)
def render(
    inventory: Optional[str] = InventoryOpt,
    json_out: bool = JsonOpt,
    out: Optional[Path] = typer.Option(
        None, "--out", help="Write the files under DIR (their absolute paths below DIR) instead of printing them."
    ),
    from_state: bool = typer.Option(
        False, "--from-state", help="Use the last sync's up/down states and weights and the marked-down set."
    ),
    state_dir: Optional[str] = StateDirOpt,
) -> None:
    from clusterctl.ops import gateway as gwops

    request = _request(inventory, state_dir)
    try:
        files = gwops.render(request, from_state=from_state, out=out).files
    except ClusterctlError as e:
        fail(str(e))
    if json_out:
        print_json(
            {
                "files": [
                    {
                        "path": f.path,
                        "mode": oct(f.mode),
                        "group": f.group,
                        "secret": f.secret,
                        **({"host": h} if h else {}),
                        **({} if out else {"text": f.text}),
                    }
                    for h, f in files
                ]
            }
        )
    elif out is not None:
        for h, f in files:
            console.print(f"wrote {out / h / f.path.lstrip('/')}", markup=False)
    else:
        for h, f in files:
            console.print(f"# ===== {h + ': ' if h else ''}{f.path} (mode {f.mode:o}, root:{f.group})", markup=False)
            console.print(f.text, markup=False, end="")


@app.command(
    "deploy",
    help="""Install the gateway on HOST (one of gateway.hosts, or 'all').

Writes the files atomically, validates them with `nginx -t` (when nginx refuses,
the old files are put back and nginx's message is shown), then reloads nginx
gracefully: streams in flight finish on the old workers. With gateway.vip it
also writes keepalived's config per host (checked with `keepalived -t`) and
reloads or starts keepalived (docs/gateway.md). Uses the last sync's
states (marked-down instances stay down). Exit 0 when every host serves the
new config, 2 when one failed, 3 for usage errors.

Example:

  clusterctl gateway deploy gw01 -i /var/lib/clusterctl-lab/inventory.yaml
""",
)
def deploy(
    host: str = typer.Argument(..., help="A gateway host, or 'all'."),
    inventory: Optional[str] = InventoryOpt,
    json_out: bool = JsonOpt,
    state_dir: Optional[str] = StateDirOpt,
    fanout: Optional[int] = FanoutOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
    ask_become_pass: bool = AskBecomePassOpt,
) -> None:
    from clusterctl.ops import gateway as gwops

    fleet_opts = dict(
        fanout=fanout, connect_timeout=connect_timeout, host_key_policy=host_key_policy, ask_become_pass=ask_become_pass
    )
    request = _request(inventory, state_dir, lambda r: gwops.deploy_hosts(r, host), **fleet_opts)
    try:
        done = gwops.deploy(request, gwops.deploy_hosts(request, host))
    except ClusterctlError as e:
        fail(str(e))
    if json_out:
        print_json(done.to_json())
    else:
        _host_rows(done.hosts)
    raise typer.Exit(int(done.code))


@app.command(
    "sync",
    help="""Re-render the gateway from the instances' current state and reload on change.

Measures every instance (`clusterctl status`: unit, /health, load over
--window seconds); instances that are not serving, marked down (drain), or
whose TP group doctor finds UNAVAILABLE (checked on every sync; --no-tp-check
skips it) are down. With gateway.dispatch least_score (the default) the
load and those downs go to the gateway hosts as scores every round (the
loopback admin endpoint, no reload); with least_conn or round_robin the
weights follow the load score (and, for mixed GPU models, measured
throughput) in the rendered config.
nginx reloads only when the rendered config changed, at most once per
gateway.sync_interval_s (--force ignores the interval).
Exit 0 applied or unchanged, 1 changed but waiting for the interval,
2 a gateway host failed, 3 usage errors.

Examples:

  clusterctl gateway sync --dry-run --json

  clusterctl gateway sync --tp-check --window 5

  clusterctl gateway sync --every 10      # keep following the instances
""",
)
def sync(
    inventory: Optional[str] = InventoryOpt,
    json_out: bool = JsonOpt,
    dry_run: bool = typer.Option(False, "--dry-run", help="Decide and render, apply nothing."),
    force: bool = typer.Option(False, "--force", help="Reload even within the sync interval."),
    tp_check: bool = typer.Option(
        True,
        "--tp-check/--no-tp-check",
        help="Doctor's TP-group check of every instance's GPUs (TP 1 included; gathers facts; on by default).",
    ),
    window: float = typer.Option(5.0, "--window", min=0.0, help="Seconds between the two /metrics samples."),
    every: float = typer.Option(
        0.0,
        "--every",
        min=0.0,
        help="Sync again every SECONDS until interrupted "
        "(0: once). A change held back by the interval is applied by a later round.",
    ),
    state_dir: Optional[str] = StateDirOpt,
    fanout: Optional[int] = FanoutOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
    ask_become_pass: bool = AskBecomePassOpt,
) -> None:
    from clusterctl.ops import gateway as gwops

    fleet_opts = dict(
        fanout=fanout, connect_timeout=connect_timeout, host_key_policy=host_key_policy, ask_become_pass=ask_become_pass
    )
    request = _request(inventory, state_dir, gwops.sync_hosts, **fleet_opts)
    options = gwops.SyncOptions(dry_run=dry_run, force=force, tp_check=tp_check, window=window)
    say = (lambda s: err_console.print(s, markup=False)) if not json_out else None
    while True:
        try:
            result = gwops.sync(request, options, on_event=say)
        except ClusterctlError as e:
            fail(str(e))
        code = _print_sync(result, json_out)
        if not every:
            raise typer.Exit(int(code))
        time.sleep(every)


def _print_sync(result: gwops.SyncResult, json_out: bool) -> ExitCode:
    from clusterctl.ops import gateway as gwops

    code = gwops.sync_code(result)
    if json_out:
        print_json({**result.to_json(), "exit_code": int(code)})
        return code
    scores = (result.scores or {}).get("instances", {})
    for name, s in sorted(result.servers.items()):
        up = f"up, score {scores[name]['load']:.2f}" if name in scores else f"up, weight {s.weight}"
        console.print(f"{name}: " + (f"down ({s.reason})" if s.down else up), markup=False)
    verdict = {
        "unchanged": "config unchanged; nothing to do",
        "interval": f"config changed; reload allowed in {result.next_allowed_s:.1f} s (--force to now)",
        "dry-run": "dry run: " + ("config would change" if result.changed else "config unchanged"),
    }
    console.print(verdict.get(result.skipped or "", f"config {result.digest[:16]} applied"), markup=False)
    _host_rows(result.hosts)
    return code


@app.command(
    "status",
    help="""Show each gateway host: nginx's unit state and the config it serves,
compared with the last config sync or deploy applied, and the marked-down instances;
with gateway.vip also keepalived's state and which host holds the floating address
(no holder or two: exit 2).
Exit 0 all serve the expected config, 1 some serve another, 2 some are down, 3 usage errors.

Example:

  clusterctl gateway status --json
""",
)
def status(
    inventory: Optional[str] = InventoryOpt,
    json_out: bool = JsonOpt,
    state_dir: Optional[str] = StateDirOpt,
    fanout: Optional[int] = FanoutOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
    ask_become_pass: bool = AskBecomePassOpt,
) -> None:
    from clusterctl.ops import gateway as gwops

    from rich.markup import escape

    fleet_opts = dict(
        fanout=fanout, connect_timeout=connect_timeout, host_key_policy=host_key_policy, ask_become_pass=ask_become_pass
    )
    request = _request(inventory, state_dir, lambda r: list(r.gateway.hosts), **fleet_opts)
    try:
        st = gwops.status(request)
    except ClusterctlError as e:
        fail(str(e))
    code = st.code
    if json_out:
        print_json(st.to_json())
        raise typer.Exit(int(code))
    _host_rows(st.hosts)
    if st.vip_problem:
        console.print(f"[bold red]CRIT[/] {escape(st.vip_problem)}")
    for h in st.stale:
        console.print(f"[yellow]stale[/] {escape(h)}: serves another config than {escape(st.expected or '-')}")
    for name, m in sorted(st.marked_down.items()):
        console.print(
            escape(f"marked down: {name} ({m.get('reason', '')}, by {m.get('by', '?')} at {m.get('at', '?')})")
        )
    raise typer.Exit(int(code))


key_app = typer.Typer(
    help="Client API keys of the gateway: add (shown once), revoke, list (docs/gateway.md).",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    rich_markup_mode=None,
)
app.add_typer(key_app, name="key")


def _push_keys(request: gwops.GatewayRequest, json_out: bool, no_apply: bool, **fleet_opts: Any) -> ExitCode:
    """Apply the current key set to every gateway host, unless ``--no-apply`` (the sudo password
    is read only then)."""
    from clusterctl.ops import gateway as gwops

    if no_apply:
        return ExitCode.OK
    request = replace(request, fleets=host_fleets(request.inventory, list(request.gateway.hosts), **fleet_opts))
    say = (lambda m: err_console.print(m, markup=False)) if not json_out else None
    try:
        result = gwops.push_keys(request, on_event=say)
    except ClusterctlError as e:
        fail(str(e))
    if not json_out:
        _host_rows(result.hosts)
    return ExitCode.OK if result.ok else ExitCode.CRIT


NoApplyOpt = typer.Option(
    False,
    "--no-apply",
    help="Change the key store only; the gateway hosts get it "
    "with the next `gateway deploy` or `gateway sync` that reloads.",
)


@key_app.command(
    "add",
    help="""Create a key for client NAME and install it on every gateway host.

The key is printed once, on stdout, and never stored: only its SHA-256 is kept
(the deploy state directory's gateway-keys.json, mode 0600; on the gateway hosts
/etc/nginx/clusterctl/clients.conf, 0600 root). With --key-file the key goes to
that new file (mode 0600) instead; --json needs --key-file (the key is never in
JSON). Limits default to the inventory's gateway.client_limits (0 = none).

Examples:

  clusterctl gateway key add team-search

  clusterctl gateway key add batch-jobs --rps 20 --burst 40 --streams 64 --key-file /root/batch.key --json
""",
)
def key_add(
    name: str = typer.Argument(..., help="Client name (letters, digits, '_', '.', '-')."),
    inventory: Optional[str] = InventoryOpt,
    json_out: bool = JsonOpt,
    rps: Optional[float] = typer.Option(None, "--rps", help="Requests per second for this key."),
    burst: Optional[int] = typer.Option(None, "--burst", help="Requests above the rate let through."),
    streams: Optional[int] = typer.Option(None, "--streams", help="Concurrent requests for this key."),
    key_file: Optional[Path] = typer.Option(
        None, "--key-file", help="Write the key to this new file (mode 0600) instead of printing it."
    ),
    no_apply: bool = NoApplyOpt,
    state_dir: Optional[str] = StateDirOpt,
    fanout: Optional[int] = FanoutOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
    ask_become_pass: bool = AskBecomePassOpt,
) -> None:
    from clusterctl.ops import gateway as gwops

    request = _request(inventory, state_dir)
    if json_out and key_file is None:
        fail("--json needs --key-file: the key is never written into JSON output")
    fd = None
    if key_file is not None:
        try:
            fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as e:
            fail(f"--key-file {key_file}: {e.strerror or e} (it must be a new file)")
    try:
        key, rec = gwops.add_key(request, name, gwops.KeyLimits(rps, burst, streams))
    except ClusterctlError as e:
        if fd is not None:
            os.close(fd)
            os.unlink(key_file)  # type: ignore[arg-type]
        fail(str(e))
    if fd is not None:
        os.write(fd, key.encode() + b"\n")
        os.close(fd)
    else:
        print(key, flush=True)
    if not json_out:
        err_console.print(
            f"client {name}: key {'written to ' + str(key_file) if key_file else 'shown above, once'}"
            f" (fingerprint {rec.sha256[:12]})",
            markup=False,
        )
    code = _push_keys(
        request,
        json_out,
        no_apply,
        fanout=fanout,
        connect_timeout=connect_timeout,
        host_key_policy=host_key_policy,
        ask_become_pass=ask_become_pass,
    )
    if json_out:
        print_json(
            {"client": rec.to_json(), "key_file": str(key_file), "applied": not no_apply, "exit_code": int(code)}
        )
    raise typer.Exit(int(code))


@key_app.command(
    "revoke",
    help="""Revoke client NAME's key on every gateway host.

nginx reloads gracefully: requests and streams already in flight with the key
finish; every new request with it is a 401.

Example:

  clusterctl gateway key revoke team-search
""",
)
def key_revoke(
    name: str = typer.Argument(..., help="Client name."),
    inventory: Optional[str] = InventoryOpt,
    json_out: bool = JsonOpt,
    no_apply: bool = NoApplyOpt,
    state_dir: Optional[str] = StateDirOpt,
    fanout: Optional[int] = FanoutOpt,
    connect_timeout: Optional[float] = ConnectTimeoutOpt,
    host_key_policy: Optional[str] = HostKeyOpt,
    ask_become_pass: bool = AskBecomePassOpt,
) -> None:
    from clusterctl.ops import gateway as gwops

    request = _request(inventory, state_dir)
    try:
        rec = gwops.revoke_key(request, name)
    except ClusterctlError as e:
        fail(str(e))
    if not json_out:
        err_console.print(f"client {name}: key revoked (fingerprint {rec.sha256[:12]})", markup=False)
    code = _push_keys(
        request,
        json_out,
        no_apply,
        fanout=fanout,
        connect_timeout=connect_timeout,
        host_key_policy=host_key_policy,
        ask_become_pass=ask_become_pass,
    )
    if json_out:
        print_json({"revoked": name, "fingerprint": rec.sha256[:12], "applied": not no_apply, "exit_code": int(code)})
    raise typer.Exit(int(code))


@key_app.command(
    "list",
    help="""List the clients with a key: name, fingerprint (first 12 hex of the
key's SHA-256), created, by whom, limits. Never shows a key.

Example:

  clusterctl gateway key list --json
""",
)
def key_list(
    inventory: Optional[str] = InventoryOpt, json_out: bool = JsonOpt, state_dir: Optional[str] = StateDirOpt
) -> None:
    from clusterctl.ops import gateway as gwops

    request = _request(inventory, state_dir)
    gw = request.gateway
    try:
        clients = gwops.list_keys(request)
    except ClusterctlError as e:
        fail(str(e))
    if json_out:
        print_json(
            {
                "auth": gw.auth,
                "clients": [c.to_json() for c in clients],
                "defaults": {
                    "requests_per_second": gw.key_requests_per_second,
                    "burst": gw.key_burst,
                    "streams": gw.key_streams,
                },
            }
        )
        raise typer.Exit(0)
    if gw.auth != "keys":
        err_console.print("gateway.auth is 'none': keys are not checked", markup=False)
    for c in clients:
        lim = (
            ", ".join(
                f"{k} {v}"
                for k, v in (("rps", c.requests_per_second), ("burst", c.burst), ("streams", c.streams))
                if v is not None
            )
            or "default limits"
        )
        console.print(f"{c.name}  {c.sha256[:12]}  created {c.created} by {c.by}  ({lim})", markup=False)
    if not clients:
        console.print(
            "no client keys"
            + (": every request is refused (401); `clusterctl gateway key add NAME`" if gw.auth == "keys" else ""),
            markup=False,
        )
