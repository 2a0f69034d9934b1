"""The report's overview for large clusters: heatmaps and top offenders.

A cluster of 128 hosts with 1,024 GPUs and 250 NICs does not fit in tables and line
charts (a line per NIC is unreadable, the host table is pages long).  The overview
shows every GPU and every data NIC as one cell of a heatmap (hosts x GPUs, hosts x
NICs), coloured by the worst finding on it, and again by its load (GPU utilisation,
fraction of time the NIC was paused by PFC) from the run's metrics; then the top
offending hosts and the problems that touch the most hosts.  Plain inline SVG with a
``<title>`` tooltip per cell: no script, nothing fetched.

A cell's colour says what was seen: the worst finding whose subject is that GPU or
NIC; a host that could not be checked (``host.reachable`` not OK) greys its cells as
UNKNOWN; a cell with no finding is OK only when the host's checks of that kind ran
(some finding ``gpu.*`` / ``roce.*``/``net.*`` on the host), else "no data".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from html import escape
from typing import Any

from clusterctl.diagnose.findings import Finding, Severity
from clusterctl.inventory.nodeset import fold, natural_key

#: Hosts per column of a heatmap (more hosts: more columns side by side).
ROWS_PER_COLUMN = 32
#: Rows of the top-offender lists.
TOP_N = 10

SEVERITY_FILL = {"OK": "#a8dba8", "WARN": "#ffbf47", "CRIT": "#d62728", "UNKNOWN": "#9467bd", "none": "#e4e4e4"}
_CELL, _GAP, _ROW, _LABEL_W, _COL_GAP, _HEAD = 11, 1, 12, 78, 18, 34


def _kind(subject: str) -> str | None:
    if subject.startswith("gpu:"):
        return "gpu"
    if subject.startswith("nic:"):
        return "nic"
    return None


def _checks_of(check: str) -> str | None:
    if check.startswith("gpu."):
        return "gpu"
    if check.startswith(("roce.", "net.")):
        return "nic"
    return None


@dataclass
class Cell:
    host: str
    subject: str
    severity: str = "none"  # OK / WARN / CRIT / UNKNOWN / none
    why: str = ""
    load: float | None = None


@dataclass
class Grid:
    """Rows of cells: ``rows[host] = [Cell, ...]`` in host order."""

    kind: str
    rows: dict[str, list[Cell]]

    @property
    def cells(self) -> int:
        return sum(len(r) for r in self.rows.values())


def grids(
    findings: Iterable[Finding], loads: Mapping[str, Mapping[tuple[str, str], float]], hosts: Iterable[str] = ()
) -> dict[str, Grid]:
    """``{"gpu": Grid, "nic": Grid}`` from the run's findings and its load values
    (``loads["gpu"][(host, "gpu:3")] = 0.7``)."""
    findings = list(findings)
    subjects: dict[str, dict[str, set[str]]] = {"gpu": {}, "nic": {}}
    ran: dict[str, set[str]] = {"gpu": set(), "nic": set()}
    unreachable: dict[str, str] = {}
    all_hosts = set(hosts)
    for f in findings:
        if not f.host:
            continue
        all_hosts.add(f.host)
        k = _kind(f.subject)
        if k:
            subjects[k].setdefault(f.host, set()).add(f.subject)
        kind = _checks_of(f.check)
        if kind:
            ran[kind].add(f.host)
        if f.check == "host.reachable" and f.severity != Severity.OK:
            unreachable[f.host] = f.message
    for k, values in loads.items():
        for host, subject in values:
            all_hosts.add(host)
            if _kind(subject) == k:
                subjects[k].setdefault(host, set()).add(subject)
    order = sorted(all_hosts, key=natural_key)
    out: dict[str, Grid] = {}
    for k in ("gpu", "nic"):
        rows: dict[str, list[Cell]] = {}
        for h in order:
            subs = sorted(subjects[k].get(h, set()), key=natural_key)
            cells = {s: Cell(h, s, load=(loads.get(k) or {}).get((h, s))) for s in subs}
            for c in cells.values():
                if h in unreachable:
                    c.severity, c.why = "UNKNOWN", f"host not checked: {unreachable[h]}"
                elif h in ran[k]:
                    c.severity = "OK"
            rows[h] = list(cells.values())
        # a host that could not be checked has no GPU/NIC subjects: as many UNKNOWN cells as most hosts have
        counts = sorted(len(r) for r in rows.values() if r)
        usual = counts[len(counts) // 2] if counts else 0
        for h in unreachable:
            if not rows.get(h) and usual:
                rows[h] = [Cell(h, f"{k}:?", "UNKNOWN", f"host not checked: {unreachable[h]}") for _ in range(usual)]
        out[k] = Grid(k, rows)
    for f in findings:
        k = _kind(f.subject)
        if not k or not f.host or f.host in unreachable:
            continue
        for c in out[k].rows.get(f.host, []):
            if c.subject == f.subject:
                cur = Severity[c.severity] if c.severity != "none" else None
                if cur is None or f.severity.rank > cur.rank or (f.severity.rank == cur.rank and not c.why):
                    c.severity = f.severity.name
                    c.why = f"{f.check}: {f.message}" if f.severity != Severity.OK else c.why
    return out


def _load_fill(v: float | None) -> str:
    if v is None:
        return SEVERITY_FILL["none"]
    x = min(1.0, max(0.0, v))
    lo, hi = (239, 243, 255), (8, 48, 107)  # pale to dark blue
    r, g, b = (round(a + (c - a) * x) for a, c in zip(lo, hi))
    return f"#{r:02x}{g:02x}{b:02x}"


def heatmap(title: str, grid: Grid, *, by: str, fmt_load: str = "{:.0%}", scale: float = 1.0) -> str:
    """An SVG heatmap: hosts in columns of :data:`ROWS_PER_COLUMN` rows, one cell per GPU/NIC,
    coloured by worst finding (``by="severity"``) or load (``by="load"``; darkest at ``scale``)."""
    hosts = [h for h, cells in grid.rows.items() if cells]
    width_cells = max((len(grid.rows[h]) for h in hosts), default=0)
    block_w = _LABEL_W + width_cells * (_CELL + _GAP) + _COL_GAP
    ncols = max(1, -(-len(hosts) // ROWS_PER_COLUMN))
    nrows = min(len(hosts), ROWS_PER_COLUMN)
    width = max(360, ncols * block_w + 10)
    height = _HEAD + nrows * _ROW + 8
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}" shape-rendering="crispEdges">'
        f'<text x="0" y="14" font-size="13" font-weight="bold">{escape(title)}</text>'
    ]
    # legend
    if by == "severity":
        items = [(SEVERITY_FILL[s], s if s != "none" else "no data") for s in ("OK", "WARN", "CRIT", "UNKNOWN", "none")]
    else:
        items = [
            (_load_fill(v), fmt_load.format(v * scale) + ("+" if v == 1.0 and scale < 1.0 else ""))
            for v in (0.0, 0.25, 0.5, 0.75, 1.0)
        ] + [(SEVERITY_FILL["none"], "no data")]
    x = 0
    for fill, label in items:
        out.append(
            f'<rect x="{x}" y="20" width="10" height="10" fill="{fill}"/>'
            f'<text x="{x + 13}" y="29" font-size="10">{escape(label)}</text>'
        )
        x += 22 + 7 * len(label)
    if not hosts:
        out.append(f'<text x="0" y="{_HEAD + 10}" font-size="12" fill="#666">no data</text>')
    for i, h in enumerate(hosts):
        bx = (i // ROWS_PER_COLUMN) * block_w
        y = _HEAD + (i % ROWS_PER_COLUMN) * _ROW
        cells = grid.rows[h]
        if by == "severity":
            fills = [SEVERITY_FILL[c.severity] for c in cells]
            notes = [f"{c.subject} {c.severity} ({c.why})" for c in cells if c.why]
            states = sorted({c.severity if c.severity != "none" else "no data" for c in cells})
            tip = f"{h}: " + ("; ".join(notes) if notes else f"{len(cells)} {grid.kind}s, {', '.join(states)}")
        else:
            fills = [
                _load_fill(None if c.load is None else round(min(1.0, c.load / scale) * 10) / 10) for c in cells
            ]  # 11 steps
            tip = f"{h}: " + ", ".join(
                f"{c.subject} " + (fmt_load.format(c.load) if c.load is not None else "no data") for c in cells
            )
        # one <g> per host with one tooltip; runs of equal colour drawn as one rect (fewer elements to lay out)
        out.append(
            f'<g><title>{escape(tip[:1000])}</title>'
            f'<text x="{bx + _LABEL_W - 4}" y="{y + 9}" font-size="9" text-anchor="end">{escape(h)}</text>'
        )
        j = 0
        while j < len(fills):
            k = j
            while k + 1 < len(fills) and fills[k + 1] == fills[j]:
                k += 1
            x0 = bx + _LABEL_W + j * (_CELL + _GAP)
            w = (k - j + 1) * (_CELL + _GAP) - _GAP
            out.append(f'<rect x="{x0}" y="{y}" width="{w}" height="{_CELL - 1}" fill="{fills[j]}"/>')
            j = k + 1
        out.append("</g>")
    # the cell borders: one path of white lines per column of hosts
    for b in range(ncols):
        rows_here = min(ROWS_PER_COLUMN, len(hosts) - b * ROWS_PER_COLUMN)
        x0 = b * block_w + _LABEL_W
        d = "".join(f"M{x0 + m * (_CELL + _GAP) - 0.5} {_HEAD}v{rows_here * _ROW}" for m in range(1, width_cells))
        if d:
            out.append(f'<path d="{d}" stroke="#fff" stroke-width="{_GAP}"/>')
    return "".join(out) + "</svg>"


def top_hosts(host_rows: list[dict[str, Any]], n: int = TOP_N) -> list[dict[str, Any]]:
    """The ``n`` worst hosts of :func:`clusterctl.report.run.host_summary` (already worst first),
    then by problem count; hosts without a problem are left out."""
    rank = {s.name: s.rank for s in Severity}
    bad = [r for r in host_rows if r["problems"]]
    return sorted(bad, key=lambda r: (-rank[r["worst"]], -r["problems"], natural_key(r["host"])))[:n]


def top_problems(findings: Iterable[Finding], n: int = TOP_N) -> list[dict[str, Any]]:
    """The checks failing on the most hosts, worst first: ``{"severity", "check", "hosts"
    (a node set), "host_count", "count", "example"}``."""
    by: dict[tuple[Severity, str], list[Finding]] = {}
    for f in findings:
        if f.severity != Severity.OK:
            by.setdefault((f.severity, f.check), []).append(f)
    rows: list[dict[str, Any]] = []
    for (sev, check), fs in by.items():
        hosts = sorted({f.host for f in fs if f.host}, key=natural_key)
        rows.append(
            {
                "severity": sev.name,
                "rank": sev.rank,
                "check": check,
                "hosts": fold(hosts) if hosts else "-",
                "host_count": len(hosts),
                "count": len(fs),
                "example": f"{fs[0].subject}: {fs[0].message}",
            }
        )
    rows.sort(key=lambda r: (-r["rank"], -r["host_count"], -r["count"], r["check"]))
    return rows[:n]
