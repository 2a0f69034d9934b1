"""``clusterctl status --watch``: instances refreshing in place, worst first, grouped at scale.

Each refresh collects status over the same Fleet (connections reused) and draws one
frame: a summary line; when there are more instances than fit (``--top``), one row per
template (or per host for instances without one) with its counts and load; then the
``--top`` worst instances, sorted by health first and then ``--sort``.  On a terminal the
frame is redrawn in place (rich Live); piped, each frame is printed as plain text; with
``--json`` each refresh is one JSON line.  Ctrl-C ends it (exit 0); ``--count`` bounds it.
"""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

from clusterctl.diagnose.findings import Severity

if TYPE_CHECKING:
    from rich.console import Console

    from clusterctl.ops.status import InstanceStatus

#: ``--sort`` keys: a row's value, larger first (name: alphabetical).
SORTS: dict[str, Callable[[Any], Any]] = {
    "load": lambda r: r.load if r.load is not None else -1.0,
    "kv": lambda r: r.kv_usage if r.kv_usage is not None else -1.0,
    "queue": lambda r: r.waiting if r.waiting is not None else -1.0,
    "tps": lambda r: r.tokens_per_s if r.tokens_per_s is not None else -1.0,
    "ttft": lambda r: r.ttft_p90_s if r.ttft_p90_s is not None else -1.0,
    "restarts": lambda r: r.restarts if r.restarts is not None else -1,
    "name": lambda r: r.name,
}
STYLE = {"OK": "green", "WARN": "yellow", "CRIT": "bold red", "UNKNOWN": "magenta"}


def order(rows: list[InstanceStatus], sort: str) -> list[InstanceStatus]:
    """Worst health first, then by ``sort`` (largest first; ``name`` alphabetical)."""
    key = SORTS[sort]
    if sort == "name":
        return sorted(rows, key=lambda r: (-r.severity.rank, r.name))
    return sorted(rows, key=lambda r: (-r.severity.rank, -key(r), r.name))


def groups(rows: list[InstanceStatus]) -> list[dict[str, Any]]:
    """One summary per template (``host:NAME`` for instances without one), worst first."""
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        g = out.setdefault(
            r.template or f"host:{r.host or '-'}",
            {
                "group": r.template or f"host:{r.host or '-'}",
                "instances": 0,
                "serving": 0,
                "degraded": 0,
                "down": 0,
                "unknown": 0,
                "kv": [],
                "waiting": 0.0,
                "tps": 0.0,
                "ttft_p90_max": None,
                "load": None,
                "worst": Severity.OK,
            },
        )
        g["instances"] += 1
        g[{"OK": "serving", "WARN": "degraded", "CRIT": "down", "UNKNOWN": "unknown"}[r.severity.name]] += 1
        if r.kv_usage is not None:
            g["kv"].append(r.kv_usage)
        g["waiting"] += r.waiting or 0.0
        g["tps"] += r.tokens_per_s or 0.0
        if r.load is not None:
            g["load"] = max(g["load"] or 0.0, r.load)
        if r.ttft_p90_s is not None:
            g["ttft_p90_max"] = max(g["ttft_p90_max"] or 0.0, r.ttft_p90_s)
        if r.severity.rank > g["worst"].rank:
            g["worst"] = r.severity
    res = list(out.values())
    for g in res:
        kv = g.pop("kv")
        g["kv_mean"] = sum(kv) / len(kv) if kv else None
        g["kv_max"] = max(kv) if kv else None
    return sorted(res, key=lambda g: (-g["worst"].rank, -(g["down"] + g["unknown"]), -g["degraded"], g["group"]))


def frame(rows: list[InstanceStatus], *, sort: str, top: int, interval: float, stamp: float, took_s: float) -> Any:
    """The rich renderable of one refresh."""
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    counts = {s: sum(1 for r in rows if r.severity.name == s) for s in ("OK", "WARN", "CRIT", "UNKNOWN")}
    head = Text(
        f"{time.strftime('%H:%M:%S', time.localtime(stamp))}  {len(rows)} instances on "
        f"{len({r.host for r in rows if r.host})} hosts: "
    )
    for s, label in (("OK", "serving"), ("WARN", "degraded"), ("CRIT", "down"), ("UNKNOWN", "unknown")):
        head.append(f"{counts[s]} {label}  ", style=STYLE[s] if counts[s] and s != "OK" else "")
    head.append(
        f"(collected in {took_s:.1f} s, every {interval:g} s, sorted by health then {sort}; Ctrl-C quits)", style="dim"
    )
    parts: list[Any] = [head]
    if len(rows) > top:
        gt = Table(title=f"by template ({len(groups(rows))} groups, worst first)", box=None, title_justify="left")
        for c in (
            "group",
            "inst",
            "serving",
            "degraded",
            "down",
            "unknown",
            "kv mean",
            "kv max",
            "waiting",
            "tok/s",
            "ttft p90 max",
            "load max",
        ):
            gt.add_column(c, no_wrap=True, justify="left" if c == "group" else "right")
        for g in groups(rows)[: max(5, top // 2)]:
            gt.add_row(
                escape(g["group"]),
                str(g["instances"]),
                str(g["serving"]),
                f"[yellow]{g['degraded']}[/]" if g["degraded"] else "0",
                f"[bold red]{g['down']}[/]" if g["down"] else "0",
                f"[magenta]{g['unknown']}[/]" if g["unknown"] else "0",
                _pct(g["kv_mean"]),
                _pct(g["kv_max"]),
                f"{g['waiting']:.0f}",
                f"{g['tps']:.0f}",
                _secs(g["ttft_p90_max"]),
                "-" if g["load"] is None else f"{g['load']:.2f}",
            )
        parts.append(gt)
    t = Table(
        title=f"instances: {'the ' + str(top) + ' worst of ' + str(len(rows)) if len(rows) > top else 'all'}",
        box=None,
        title_justify="left",
    )
    for c in ("instance", "host", "state", "rst", "kv", "run/wait", "tok/s", "ttft p90", "load", "note"):
        t.add_column(c, no_wrap=c != "note", overflow="ellipsis")
    for r in order(rows, sort)[:top]:
        t.add_row(
            escape(r.name),
            escape(r.host or "-"),
            f"[{STYLE[r.severity.name]}]{escape(r.state)}[/]",
            "-" if r.restarts is None else str(r.restarts),
            _pct(r.kv_usage),
            "-" if r.running is None else f"{r.running:.0f}/{r.waiting or 0:.0f}",
            "-" if r.tokens_per_s is None else f"{r.tokens_per_s:.0f}",
            _secs(r.ttft_p90_s),
            "-" if r.load is None else f"{r.load:.2f}",
            escape(r.message or ""),
        )
    parts.append(t)
    return Group(*parts)


def _pct(v: Optional[float]) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


def _secs(v: Optional[float]) -> str:
    """A TTFT: ``85ms``, ``1.24s``; ``n/a`` when no request got its first token in the window."""
    if v is None:
        return "n/a"
    return f"{v * 1000:.0f}ms" if v < 1 else f"{v:.2f}s"


def run_watch(
    collect: Callable[[], list[InstanceStatus]],
    *,
    interval: float,
    sort: str,
    top: Optional[int],
    count: Optional[int],
    json_out: bool,
    console: Console,
) -> int:
    """Refresh until Ctrl-C or ``count`` refreshes (the loop: :func:`clusterctl.ops.status.watch`);
    the exit code of the last one."""
    from clusterctl.ops.status import watch

    live = None
    tty = console.is_terminal and not json_out
    if tty:
        from rich.live import Live

        live = Live(console=console, auto_refresh=False, screen=False, transient=False)
        live.start()

    def show(rows: list[InstanceStatus], took: float, code: int) -> None:
        if json_out:
            sys.stdout.write(
                json.dumps({"time": time.time(), "instances": [r.to_json() for r in rows], "exit_code": code}) + "\n"
            )
            sys.stdout.flush()
            return
        room = max(5, console.size.height - 8) if tty else 25  # rows that fit under the header
        fit = top or (room if len(rows) <= room else max(5, room - 14))  # 14: the group table
        view = frame(rows, sort=sort, top=fit, interval=interval, stamp=time.time(), took_s=took)
        if live is not None:
            live.update(view, refresh=True)
        else:
            from rich.console import Console

            Console(width=200, highlight=False, file=sys.stdout, force_terminal=False).print(view)
            sys.stdout.write("\n")
            sys.stdout.flush()

    try:
        return watch(collect, interval=interval, count=count, on_refresh=show)
    finally:
        if live is not None:
            live.stop()
