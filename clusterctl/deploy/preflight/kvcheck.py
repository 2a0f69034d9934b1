"""After start: the KV capacity vLLM logged against the pre-flight prediction.

vLLM logs ``GPU KV cache size: 311,040 tokens`` once it has sized the cache (``CPU KV
cache size`` on the CPU backend):
0.11 once per TP rank, 0.12+ (0.33) one line for the engine, followed on the
same line by ``, Maximum concurrency ...``.  The capacity the engine can use
is the smallest rank's, so that is the logged value compared.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from clusterctl.deploy.spec import unit_name
from clusterctl.fleet import shell
from clusterctl.fleet.fleet import Fleet

_KV_LINE = re.compile(r"[A-Z]{3} KV cache size: ([\d,]+) tokens")
_ESTIMATE = re.compile(r"estimated maximum model length is (\d+)")
#: Lines that start a new vLLM process in a journal: only the last start counts.
_START = re.compile(r"vLLM API server version|non-default args:")
#: What :func:`read_kv_checks` keeps of a journal: the start markers and the KV lines.
_KEEP = "KV cache size:|estimated maximum model length|vLLM API server version|non-default args:"
_SEP = "=== clusterctl-kvcheck "


@dataclass(frozen=True)
class KvCheck:
    """``predicted`` and ``logged`` tokens; ``error_pct`` = (predicted - logged) / logged x 100
    (positive: the prediction was too high).  ``logged`` is ``None`` when the journal has no
    KV-size line yet (still loading, or start-up failed); ``per_rank`` lists every value logged."""

    predicted: int
    logged: int | None
    per_rank: tuple[int, ...] = field(default_factory=tuple)

    @property
    def error_pct(self) -> float | None:
        if not self.logged:
            return None
        return (self.predicted - self.logged) / self.logged * 100

    def to_json(self) -> dict[str, Any]:
        err = self.error_pct
        return {
            "predicted_tokens": self.predicted,
            "logged_tokens": self.logged,
            "per_rank": list(self.per_rank),
            "error_pct": None if err is None else round(err, 3),
        }


def logged_kv_tokens(journal_text: str) -> tuple[int, ...]:
    """Every "GPU KV cache size" value of the last start in ``journal_text``."""
    values: list[int] = []
    for line in journal_text.splitlines():
        if _START.search(line):
            values = []
        m = _KV_LINE.search(line)
        if m:
            values.append(int(m.group(1).replace(",", "")))
    return tuple(values)


def kv_prediction_error(predicted_tokens: int, journal_text: str) -> KvCheck:
    """Compare a predicted KV capacity (tokens) with what vLLM logged in ``journal_text``."""
    values = logged_kv_tokens(journal_text)
    return KvCheck(predicted=predicted_tokens, logged=min(values) if values else None, per_rank=values)


def logged_max_len_estimate(journal_text: str) -> int | None:
    """vLLM's "estimated maximum model length" from a KV-cache start-up failure, if any (last one)."""
    found = _ESTIMATE.findall(journal_text)
    return int(found[-1]) if found else None


def read_kv_checks(
    fleet: Fleet, predicted: Mapping[str, tuple[str, int]], *, timeout: float = 30.0
) -> dict[str, KvCheck | str]:
    """After start: each instance's :class:`KvCheck` from its unit's journal on its host.

    ``predicted``: instance → (host, predicted KV tokens), e.g.
    ``PreflightReport.predictions()``.  One command per host through ``fleet``
    (journalctl of ``clusterctl-NAME.service``, filtered to the start and KV
    lines, as root).  An instance whose host could not be read gets a string
    saying why instead of a check.
    """
    by_host: dict[str, list[str]] = {}
    for name, (host, _) in predicted.items():
        by_host.setdefault(host, []).append(name)
    commands = {}
    for host, names in by_host.items():
        parts = [
            f"echo {shell.quote(_SEP + n)}; journalctl -u {shell.quote(unit_name(n))} -o cat --no-pager "
            f"| grep -E {shell.quote(_KEEP)}"
            for n in sorted(names)
        ]
        commands[host] = "; ".join(parts) + "; true"
    out: dict[str, KvCheck | str] = {}
    if not commands:
        return out
    results = fleet.run(commands, sudo=True, timeout=timeout)
    for r in results:
        if str(r.status) != "ok":
            for n in by_host.get(r.host, []):
                out[n] = f"{r.host}: {r.status}: {r.error or r.stderr.strip()[-200:]}"
            continue
        texts: dict[str, list[str]] = {}
        current: list[str] | None = None
        for line in r.stdout.splitlines():
            if line.startswith(_SEP):
                current = texts.setdefault(line[len(_SEP) :], [])
            elif current is not None:
                current.append(line)
        for n in by_host.get(r.host, []):
            out[n] = kv_prediction_error(predicted[n][1], "\n".join(texts.get(n, [])))
    return out
