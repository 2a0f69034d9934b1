"""Pre-flight's verdicts: problems (CRIT/WARN with numbers and what would fit), rows, the report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clusterctl.deploy.preflight import memory as M
from clusterctl.diagnose.findings import Finding, Severity


@dataclass
class PreflightProblem:
    """One reason to refuse (CRIT) or to look (WARN); ``numbers`` are the figures behind it
    (GiB rounded to 0.01, tokens), ``fit`` what would fit instead."""

    severity: Severity
    check: str
    message: str
    numbers: dict[str, Any] = field(default_factory=dict)
    fit: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "severity": self.severity.name,
            "check": self.check,
            "message": self.message,
            "numbers": self.numbers,
            "fit": self.fit,
        }


@dataclass
class InstanceRow:
    """Pre-flight's verdict on one instance.  ``budget`` is ``None`` when memory could not be
    predicted; ``predicted_kv_tokens`` is what vLLM should log as "GPU KV cache size"."""

    instance: str
    host: str | None
    gpus: tuple[int, ...]
    engine_version: str | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    budget: M.Budget | None = None
    weights_source: str | None = None
    problems: list[PreflightProblem] = field(default_factory=list)
    #: a pipeline stage of a multi-node replica: the replica's name (``instance`` is the stage's unit,
    #: ``NAME`` or ``NAME-nodeR``) and which stage (``pipeline stage R of N: layers a-b of L``)
    replica: str | None = None
    stage: str | None = None

    @property
    def ok(self) -> bool:
        return not any(p.severity == Severity.CRIT for p in self.problems)

    @property
    def severity(self) -> Severity:
        return max((p.severity for p in self.problems), key=lambda s: s.rank, default=Severity.OK)

    @property
    def predicted_kv_tokens(self) -> int | None:
        return None if self.budget is None else self.budget.kv_tokens

    def add(self, severity: Severity, check: str, message: str, **kw: Any) -> None:
        self.problems.append(PreflightProblem(severity, check, message, **kw))

    def to_json(self) -> dict[str, Any]:
        b = self.budget
        mem = (
            None
            if b is None
            else {
                "ranks": [r.to_json() for r in b.ranks],
                "kv_bytes_per_token": b.kv_bytes_per_token,
                "max_model_len": b.max_model_len,
                "needed_kv_gib": round(M.gib(b.needed_kv), 2),
                "predicted_kv_tokens": b.kv_tokens,
                "max_concurrency": round(b.max_concurrency(), 2),
                "estimated_max_model_len": b.max_len_for(b.worst.available_kv),
                "weights_source": self.weights_source,
            }
        )
        return {
            "instance": self.instance,
            "host": self.host,
            "gpus": list(self.gpus),
            "ok": self.ok,
            **({"replica": self.replica, "stage": self.stage} if self.replica else {}),
            "severity": self.severity.name,
            "engine_version": self.engine_version,
            "settings": self.settings,
            "memory": mem,
            "problems": [p.to_json() for p in self.problems],
        }


@dataclass
class PreflightReport:
    """Every instance's row; ``ok`` when no row has a CRIT problem."""

    rows: list[InstanceRow] = field(default_factory=list)
    margin_bytes: int = M.MARGIN_BYTES

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.rows)

    @property
    def refused(self) -> list[str]:
        """The refused instances (a multi-node replica by its name, once, whichever stage refused)."""
        return list(dict.fromkeys(r.replica or r.instance for r in self.rows if not r.ok))

    def row(self, instance: str) -> InstanceRow:
        for r in self.rows:
            if r.instance == instance:
                return r
        raise KeyError(instance)

    def predictions(self) -> dict[str, tuple[str, int]]:
        """Instance → (host, predicted "GPU KV cache size" tokens), for ``kvcheck.read_kv_checks``.
        A multi-node replica: its head's host and the smallest stage's tokens (vLLM sizes the cache
        to the smallest worker's block count), only when every stage was predicted."""
        out = {
            r.instance: (r.host, r.budget.kv_tokens)
            for r in self.rows
            if r.budget is not None and r.host is not None and r.replica is None
        }
        replicas: dict[str, list[InstanceRow]] = {}
        for r in self.rows:
            if r.replica is not None:
                replicas.setdefault(r.replica, []).append(r)
        for name, rows in replicas.items():
            if all(r.budget is not None for r in rows) and rows[0].host is not None:
                out[name] = (rows[0].host, min(r.budget.kv_tokens for r in rows if r.budget is not None))
        return out

    def worst(self) -> Severity:
        return max((r.severity for r in self.rows), key=lambda s: s.rank, default=Severity.OK)

    def findings(self) -> list[Finding]:
        """The problems as findings (``check`` prefixed ``preflight.``), for the shared renderers."""
        out = []
        for r in self.rows:
            for p in r.problems:
                fit = ", ".join(f"{k} {v}" for k, v in p.fit.items() if v is not None)
                out.append(
                    Finding(
                        check=f"preflight.{p.check}",
                        severity=p.severity,
                        host=r.host,
                        subject=f"instance:{r.instance}",
                        message=p.message,
                        action=f"would fit: {fit}" if fit else "",
                        evidence=tuple(f"{k}={v}" for k, v in p.numbers.items()),
                    )
                )
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "severity": self.worst().name,
            "refused": self.refused,
            "margin_gib": round(M.gib(self.margin_bytes), 2),
            "instances": [r.to_json() for r in self.rows],
        }
