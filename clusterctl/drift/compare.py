"""Compare greedy outputs with a baseline (vLLM's rules, ``tests/models/utils.py``) and judge thresholds.

Per prompt:

- tokens are compared as vLLM's token ids (``token_id:N``, when both outputs
  were recorded with ``return_tokens_as_token_ids``), else as strings;
- exact: same tokens and same text;
- first divergence: index of the first differing token (None when exact; the
  shorter length when one is a prefix of the other);
- vLLM's rule (``check_logprobs_close``): at the first differing token each
  side's token is in the other side's top-k; later tokens are not judged; a
  length-only difference (one output a prefix of the other) passes, as in
  vLLM, whose check walks the common length only (``length_only`` says so);
- agreement: common-prefix tokens / baseline tokens (0..1);
- KL: mean over positions up to and including the first divergence (where both
  saw the same context) of KL(baseline || new) over the union of the two top-k
  sets, a token missing on one side taking that side's smallest top-k logprob
  (the API gives only the top k, so this is an approximation), nats.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from clusterctl.drift.client import Output
from clusterctl.errors import ConfigError, Problem


@dataclass(frozen=True)
class PromptDiff:
    id: str
    exact: bool
    first_divergence: int | None
    vllm_rule: bool
    agreement: float
    kl: float
    baseline_token: str | None = None
    new_token: str | None = None
    length_only: bool = False
    #: The differing tokens' ids (``token_id:N``) when the outputs were compared by id.
    baseline_id: str | None = None
    new_id: str | None = None


def _kl(p_top: Mapping[str, float], q_top: Mapping[str, float]) -> float:
    if not p_top or not q_top:
        return 0.0
    keys = set(p_top) | set(q_top)
    pf, qf = min(p_top.values()), min(q_top.values())
    p = {t: math.exp(p_top.get(t, pf)) for t in keys}
    q = {t: math.exp(q_top.get(t, qf)) for t in keys}
    sp, sq = sum(p.values()), sum(q.values())
    return max(0.0, sum((p[t] / sp) * math.log((p[t] / sp) / (q[t] / sq)) for t in keys))


def diff(pid: str, base: Output, new: Output) -> PromptDiff:
    if base.by_id != new.by_id:
        raise ValueError(f"prompt {pid}: one output has token ids, the other token strings")
    n = min(len(base.tokens), len(new.tokens))
    first = next((i for i in range(n) if base.tokens[i] != new.tokens[i]), None)
    if first is None and len(base.tokens) != len(new.tokens):
        first = n
    exact = first is None and base.text == new.text
    rule = True
    bt = nt = None
    ids: tuple[str | None, str | None] = (None, None)
    if first is not None and first < n:
        bid, nid = base.tokens[first], new.tokens[first]
        btop = base.top[first] if first < len(base.top) else {}
        ntop = new.top[first] if first < len(new.top) else {}
        rule = bid in ntop and nid in btop
        bt, nt = base.token_text(first), new.token_text(first)
        ids = (bid, nid) if base.by_id else (None, None)
    last = n - 1 if first is None else min(first, n - 1)
    kls = [_kl(base.top[i], new.top[i]) for i in range(last + 1) if i < len(base.top) and i < len(new.top)]
    agreement = (n if first is None else first) / max(1, len(base.tokens))
    return PromptDiff(
        pid,
        exact,
        first,
        rule,
        min(1.0, agreement),
        sum(kls) / len(kls) if kls else 0.0,
        bt,
        nt,
        first is not None and first == n,
        *ids,
    )


def summarize(diffs: list[PromptDiff]) -> dict[str, float]:
    """Rates over prompts (0..1) and KL (nats): exact_match, vllm_rule_pass, agreement, mean_kl, max_kl."""
    n = max(1, len(diffs))
    return {
        "prompts": len(diffs),
        "exact_match": sum(d.exact for d in diffs) / n,
        "vllm_rule_pass": sum(d.vllm_rule for d in diffs) / n,
        "agreement": sum(d.agreement for d in diffs) / n,
        "mean_kl": sum(d.kl for d in diffs) / n,
        "max_kl": max((d.kl for d in diffs), default=0.0),
    }


@dataclass(frozen=True)
class Thresholds:
    """Pass limits: rates are minima (0..1), KL is a maximum (nats)."""

    min_exact_match: float = 0.9
    min_vllm_rule_pass: float = 1.0
    max_mean_kl: float = 0.01
    #: With a calibration: limits are the noise floor widened by this factor (never tighter than above).
    noise_factor: float = 2.0

    def calibrated(self, floor: Mapping[str, float]) -> "Thresholds":
        """Limits relative to a measured noise floor: ``1 - factor*(1 - floor)`` for rates, ``factor*floor`` for KL."""
        f = self.noise_factor
        return Thresholds(
            min(self.min_exact_match, 1 - f * (1 - floor["exact_match"])),
            min(self.min_vllm_rule_pass, 1 - f * (1 - floor["vllm_rule_pass"])),
            max(self.max_mean_kl, f * floor["mean_kl"]),
            f,
        )

    def judge(self, s: Mapping[str, float]) -> list[str]:
        """The reasons ``s`` fails; empty when it passes."""
        out = []
        if s["exact_match"] < self.min_exact_match:
            out.append(f"exact match {s['exact_match']:.0%} < {self.min_exact_match:.0%}")
        if s["vllm_rule_pass"] < self.min_vllm_rule_pass:
            out.append(f"vLLM top-k rule {s['vllm_rule_pass']:.0%} < {self.min_vllm_rule_pass:.0%}")
        if s["mean_kl"] > self.max_mean_kl:
            out.append(f"mean KL {s['mean_kl']:.4f} > {self.max_mean_kl:.4f}")
        return out


_KEYS = {"min_exact_match", "min_vllm_rule_pass", "max_mean_kl", "noise_factor"}


def load_thresholds(path: str | Path, model: str | None) -> Thresholds:
    """``default:`` then ``models: {NAME: {...}}`` overrides from a YAML file; errors name ``file:line``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError([Problem(str(path), 0, f"cannot read: {e.strerror or e}")]) from None
    try:
        node = yaml.compose(text)
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise ConfigError([Problem(str(path), mark.line + 1 if mark else 0, f"not YAML: {e}")]) from None
    lines = _key_lines(node)
    if not isinstance(doc, dict):
        raise ConfigError([Problem(str(path), 1, "expected a mapping with 'default' and 'models'")])
    merged: dict[str, Any] = {}
    for section, body in (
        ("default", doc.get("default") or {}),
        ("models", ((doc.get("models") or {}).get(model) if model else None) or {}),
    ):
        if not isinstance(body, dict):
            raise ConfigError([Problem(str(path), lines.get(section, 0), f"'{section}' must be a mapping")])
        for k, v in body.items():
            if k not in _KEYS or isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ConfigError(
                    [
                        Problem(
                            str(path), lines.get(str(k), 0), f"{k}: expected one of {sorted(_KEYS)} with a number >= 0"
                        )
                    ]
                )
            merged[k] = float(v)
    return Thresholds(**merged)


def _key_lines(node: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                out.setdefault(str(k.value), k.start_mark.line + 1)
                stack.append(v)
    return out
