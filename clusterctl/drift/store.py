"""Named baselines as JSON files under ``$XDG_STATE_HOME/clusterctl/drift/`` (written temp + rename).

A baseline holds the request parameters (k, seed), the environment it was
recorded in (model, vLLM version, quantization, GPU, TP: what the endpoint
tells plus what the user adds) and each prompt's greedy :class:`Output`.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clusterctl.config import default_state_dir
from clusterctl.drift.client import Output
from clusterctl.errors import ClusterctlError
from clusterctl.files import write_atomic

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def drift_dir(state_dir: Path | None = None) -> Path:
    return (state_dir or default_state_dir()) / "drift"


def store_path(kind: str, name: str, state_dir: Path | None) -> Path:
    """``<state>/drift/<kind>/<name>.json``; raises ClusterctlError when ``name`` is not a safe file name."""
    if not _NAME.match(name):
        raise ClusterctlError(f"{name!r}: a {kind} name is letters, digits, '.', '_', '-' (at most 64)")
    return drift_dir(state_dir) / kind / f"{name}.json"


@dataclass
class Baseline:
    name: str
    env: dict[str, Any]
    k: int
    seed: int
    prompts: dict[str, str]
    outputs: dict[str, Output]
    created: float = field(default_factory=time.time)
    #: Prompts left out at recording (id -> the endpoint's reason, e.g. longer than max_model_len).
    skipped: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "created": self.created,
            "env": self.env,
            "k": self.k,
            "seed": self.seed,
            "items": [{"id": i, "prompt": self.prompts[i], **self.outputs[i].to_json()} for i in self.outputs],
            "skipped": self.skipped,
        }


def _skipped(v: Any) -> dict[str, str]:
    if v is not None and not isinstance(v, dict):
        raise ValueError("'skipped' is not an object")
    return {str(k): str(r) for k, r in (v or {}).items()}


def save(b: Baseline, state_dir: Path | None = None) -> Path:
    path = store_path("baselines", b.name, state_dir)
    write_atomic(path, json.dumps(b.to_json(), indent=1) + "\n")
    return path


def load(name: str, state_dir: Path | None = None) -> Baseline:
    path = store_path("baselines", name, state_dir)
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        items = d["items"]
        if not isinstance(items, list) or not all(
            isinstance(i, dict) and isinstance(i.get("prompt"), str) for i in items
        ):
            raise ValueError("'items' is not a list of objects with a string 'prompt'")
        env = d.get("env", {})
        if not isinstance(env, dict):
            raise ValueError("'env' is not an object")
        return Baseline(
            str(d["name"]),
            env,
            int(d["k"]),
            int(d["seed"]),
            {str(i["id"]): i["prompt"] for i in items},
            {str(i["id"]): Output.from_json(i) for i in items},
            float(d.get("created", 0)),
            _skipped(d.get("skipped")),
        )
    except FileNotFoundError:
        raise ClusterctlError(
            f"no baseline {name!r} (looked for {path}); record one with "
            f"'clusterctl drift baseline URL --name {name} --prompts FILE'"
        ) from None
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
        raise ClusterctlError(f"{path}: not a readable baseline ({type(e).__name__}: {e})") from None


def save_calibration(model: str, doc: dict[str, Any], state_dir: Path | None = None) -> Path:
    path = store_path("calibration", _safe(model), state_dir)
    write_atomic(path, json.dumps(doc, indent=1) + "\n")
    return path


def load_calibration(model: str, state_dir: Path | None = None) -> dict[str, Any] | None:
    """The noise floor measured for ``model``, or None when never calibrated."""
    path = store_path("calibration", _safe(model), state_dir)
    try:
        doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return doc
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise ClusterctlError(f"{path}: not a readable calibration ({e})") from None


def _safe(model: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", model or "unknown")[:64].lstrip("._-") or "unknown"


def baseline_for(instance: str, url: str, state_dir: Path | None = None) -> str | None:
    """The baseline of an inventory instance: one named after it, else the newest recorded from ``url``;
    None when there is neither."""
    if _NAME.match(instance) and store_path("baselines", instance, state_dir).is_file():
        return instance
    best: tuple[float, str] | None = None
    for p in sorted((drift_dir(state_dir) / "baselines").glob("*.json")):
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(d, dict) and (d.get("env") or {}).get("url") == url:
            created = float(d.get("created") or 0)
            if best is None or created > best[0]:
                best = (created, p.stem)
    return None if best is None else best[1]
