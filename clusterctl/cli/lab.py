"""``clusterctl lab``: a local cluster of real systemd + sshd hosts (root only).

Thin wiring: the work is in ``clusterctl.lab`` (manager, netfaults, the
hardware package); this module parses options, prints progress on stderr,
and maps errors to exit code 3.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Optional

import typer
from rich.table import Table

from clusterctl.cli._common import JsonOpt, console, err_console, fail, print_json
from clusterctl.errors import LabError

app = typer.Typer(
    help="A local lab of systemd-nspawn hosts with simulated GPUs and NICs (root only).\n\n"
    "Example: sudo clusterctl lab up --hosts 4 && clusterctl -i "
    "/var/lib/clusterctl-lab/inventory.yaml ping all",
    no_args_is_help=True,
    rich_markup_mode=None,
)


def _progress(line: str) -> None:
    err_console.print(f"lab: {line}", markup=False, soft_wrap=True)


def _cfg():  # -> LabConfig
    from clusterctl.lab.config import LabConfig

    try:
        return LabConfig.from_env()
    except LabError as e:
        fail(str(e))


def _root() -> None:
    from clusterctl.lab.manager import require_root

    try:
        require_root()
    except LabError as e:
        fail(str(e))


@app.command()
def up(
    hosts: int = typer.Option(4, "--hosts", "-n", min=1, help="Number of hosts."),
    gpus_per_host: int = typer.Option(8, "--gpus-per-host", min=0, max=16, help="Simulated GPUs per host."),
    gpu_model: str = typer.Option("H100-SXM5-80GB", "--gpu-model", help="Simulated GPU model."),
    light: bool = typer.Option(False, "--light", help="sshd-only hosts on 127.1.x.y for scale tests (no systemd)."),
    json_out: bool = JsonOpt,
) -> None:
    """Bring the lab up and write its inventory (idempotent).

    Builds and caches the Debian template on first use (about a minute).
    A lab already up with the same size is left as it is; leftovers of a
    crashed lab are cleaned up first.

    Example: sudo clusterctl lab up --hosts 4 --gpus-per-host 8
    """
    _root()
    cfg = _cfg()
    if light:
        from clusterctl.lab import manager

        try:
            info = manager.up_light(cfg, hosts, on_event=_progress)
        except LabError as e:
            fail(str(e))
        if json_out:
            print_json(info)
        else:
            console.print(f"inventory: {info['inventory']}", markup=False, soft_wrap=True)
        return
    from clusterctl.lab import manager

    try:
        res = manager.up(cfg, hosts=hosts, gpus_per_host=gpus_per_host, gpu_model=gpu_model, on_event=_progress)
    except LabError as e:
        fail(str(e))
    if json_out:
        print_json(
            {
                "inventory": str(res.inventory),
                "already_up": res.already_up,
                "ready_s": res.ready_s,
                "template_s": res.template_s,
                "hosts": [{"name": h.spec.name, "address": h.spec.address} for h in res.state.hosts],
            }
        )
    else:
        console.print(f"inventory: {res.inventory}", markup=False)


@app.command()
def down() -> None:
    """Stop every lab host and remove all the lab created.

    Processes, overlay mounts, namespaces, veths, the bridge, cgroups and the
    lab's files go; the cached template stays.

    Example: sudo clusterctl lab down
    """
    _root()
    from clusterctl.lab import manager

    try:
        manager.down(_cfg(), on_event=_progress)
    except LabError as e:
        fail(str(e))


@app.command()
def workload(
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Inventory to write [default: LAB_DIR/workload.yaml]."),
    replicas: int = typer.Option(8, "--replicas", min=1, help="Replicas of the demo template (TP 1)."),
    gateway: Optional[str] = typer.Option(None, "--gateway", help="Host nginx runs on [default: the first]."),
    time_scale: float = typer.Option(
        0.0, "--time-scale", min=0.0, help="Simulator time scale (0: instant; 1: real latencies)."
    ),
    json_out: bool = JsonOpt,
) -> None:
    """Write the lab's inventory plus a demo workload: a model, a template and a gateway.

    The model (tiny-qwen3, about 6.6 MB) is written under LAB_DIR/models/tiny on this
    machine; `clusterctl deploy` stages it to the hosts. The lab must be up.

    Example: clusterctl lab workload --replicas 8 && clusterctl -i
    /var/lib/clusterctl-lab/workload.yaml deploy --plan
    """
    from pathlib import Path

    from clusterctl.lab import workload as wl

    cfg = _cfg()
    if not cfg.inventory_file.is_file():
        fail(f"no lab inventory at {cfg.inventory_file}: run 'clusterctl lab up' first")
    target = Path(out) if out else cfg.lab_dir / "workload.yaml"
    try:
        summary = wl.write(
            cfg.inventory_file,
            target,
            cfg.lab_dir / "models" / wl.MODEL,
            replicas=replicas,
            gateway_host=gateway,
            time_scale=time_scale,
        )
    except (OSError, KeyError, ValueError) as e:
        fail(f"lab workload: {e}")
    if json_out:
        print_json(summary)
    else:
        console.print(
            f"{summary['inventory']}: {replicas} replicas of 'pool' (model tiny from "
            f"{summary['model_dir']}), gateway on {summary['gateway']}",
            markup=False,
        )


@app.command()
def status(json_out: bool = JsonOpt) -> None:
    """Show the lab's hosts: running, frozen, active faults.

    Exit 0 when every host runs, 2 when one does not, 3 when no lab is up.

    Example: clusterctl lab status --json
    """
    from clusterctl.lab import manager

    try:
        st = manager.status(_cfg())
    except LabError as e:
        fail(str(e))
    if json_out:
        print_json(st)
    elif not st.get("up"):
        console.print(f"no lab is up ({st.get('lab_dir')})", markup=False)
    else:
        _print_status(st)
    if not st.get("up"):
        raise typer.Exit(3)
    if any(not h.get("running", True) for h in st.get("hosts", [])) or any(
        not (h.get("alive") and h.get("listening")) for h in st.get("light_hosts", [])
    ):
        raise typer.Exit(2)


def _print_status(st: dict[str, Any]) -> None:
    light = st.get("light_hosts", [])
    if light:
        up = sum(1 for h in light if h.get("alive") and h.get("listening"))
        console.print(f"light hosts: {up}/{len(light)} up (sshd listening)", markup=False)
    if not st.get("hosts"):
        return
    t = Table()
    for col in ("host", "address", "state", "faults"):
        t.add_column(col)
    for h in st["hosts"]:
        state = "frozen" if h["frozen"] else ("running" if h["running"] else "stopped")
        t.add_row(h["name"], h["address"], state, ", ".join(h["faults"]) or "-")
    console.print(t)
    console.print(f"inventory: {st['inventory']}", markup=False, soft_wrap=True)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def ssh(
    ctx: typer.Context,
    host: str = typer.Argument(..., help="Lab host name or address."),
    user: str = typer.Option("root", "--user", "-u", help="Login user (root or ops)."),
) -> None:
    """Log in to a lab host, or run a command there (after `--`).

    Uses the lab's key and strict host key checking; exits with ssh's status.

    Example: clusterctl lab ssh lab01 -- systemctl is-system-running
    """
    from clusterctl.lab import manager, ready

    cfg = _cfg()
    try:
        h = manager.find_host(cfg, host)
    except LabError as e:
        fail(str(e))
    args = [a for a in ctx.args if a != "--"] if ctx.args[:1] == ["--"] else list(ctx.args)
    # As with ssh(1), the words are joined with spaces for the remote shell.
    command = " ".join(args) if args else None
    argv = ready.ssh_argv(cfg, h, command, user=user, tty=command is None and sys.stdin.isatty())
    sys.stdout.flush()
    os.execvp(argv[0], argv)


def _option_pairs(args: list[str]) -> list[str]:
    """``--gpu 3 --code=79 nic=eth2 --on`` → ``["gpu=3", "code=79", "nic=eth2", "on=true"]``."""
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--") and "=" not in a:
            if i + 1 < len(args) and not args[i + 1].startswith("--") and "=" not in args[i + 1]:
                out.append(f"{a[2:]}={args[i + 1]}")
                i += 2
                continue
            out.append(f"{a[2:]}=true")
        elif "=" in a:
            out.append(a.lstrip("-"))
        else:
            fail(f"unexpected argument {a!r}: fault options are --name value or name=value")
        i += 1
    return out


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def inject(
    ctx: typer.Context,
    host: str = typer.Argument(..., help="Lab host name."),
    fault: str = typer.Argument(
        ..., help="Fault name: bandwidth, loss, cut, freeze, thaw, or a simulated-hardware fault."
    ),
    rate: Optional[str] = typer.Option(None, "--rate", help="bandwidth: e.g. 100mbit."),
    percent: Optional[float] = typer.Option(None, "--percent", help="loss: percent dropped."),
) -> None:
    """Inject a fault into one lab host (undo with `lab heal`).

    Network faults: bandwidth --rate R, loss --percent P, cut, freeze, thaw.
    Any other name goes to the simulated hardware (xid, gpu-lost, ecc,
    pause-storm, qos-pfc, ...; docs/lab-hardware.md) with its own options,
    as --name value or name=value.

    Example: sudo clusterctl lab inject lab02 bandwidth --rate 100mbit
    """
    _root()
    from clusterctl.lab import faults, manager

    cfg = _cfg()
    try:
        h = manager.find_host(cfg, host)
        msg = faults.inject(cfg, h, fault, rate=rate, percent=percent, options=_option_pairs(list(ctx.args)))
    except LabError as e:
        fail(str(e))
    console.print(msg, markup=False)


@app.command()
def heal(host: Optional[str] = typer.Argument(None, help="Lab host name (default: all).")) -> None:
    """Remove every injected fault from one host or from all of them.

    Example: sudo clusterctl lab heal lab02
    """
    _root()
    from clusterctl.lab import faults, manager

    cfg = _cfg()
    try:
        lines = faults.heal(cfg, manager.find_host(cfg, host) if host else None)
    except LabError as e:
        fail(str(e))
    for line in lines:
        console.print(line, markup=False)


@app.command()
def template(rebuild: bool = typer.Option(False, "--rebuild", help="Build both layers again even if cached.")) -> None:
    """Build (or show) the cached Debian template the hosts boot from.

    `lab up` builds it when missing; CI may call this first to time it.

    Example: sudo clusterctl lab template
    """
    _root()
    from clusterctl.lab import template as tpl

    cfg = _cfg()
    try:
        if rebuild:
            tpl.remove(cfg.cache_dir)
        t = tpl.ensure(cfg.cache_dir, on_event=_progress)
    except LabError as e:
        fail(str(e))
    console.print(f"template: {t.base} + {t.prep}", markup=False)
