"""The tiny real model for the real engine: made locally, cached by recipe, byte-identical.

A random-weight Llama (2 layers, hidden 256, 4 heads, 2 KV heads, vocab 4096,
bf16, about 6.6 MB) and a byte-level BPE tokenizer trained on text every Debian
machine has (``/usr/share/common-licenses``), with a chat template.  Written by
``tinyllama_gen.py`` under the real engine's venv python (it needs torch and
transformers), into ``<cache>/models/tiny-llama-<hash>/`` (built in a temp dir,
renamed when complete).  The hash covers the spec, the generator's source, the
training texts and the engine recipe, so any change makes a new directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from clusterctl.errors import LabError
from clusterctl.lab import realvllm

NAME = "tiny-llama"
SPEC: dict[str, int] = {
    "layers": 2,
    "hidden": 256,
    "heads": 4,
    "kv_heads": 2,
    "intermediate": 512,
    "vocab": 4096,
    "max_position": 4096,
    "seed": 1234,
}
TEXTS = [
    Path("/usr/share/common-licenses") / n
    for n in ("GPL-3", "GPL-2", "LGPL-2.1", "Apache-2.0", "MPL-2.0", "GFDL-1.3", "Artistic")
]
GEN = Path(__file__).with_name("tinyllama_gen.py")
STAMP = ".clusterctl-complete"


def recipe_hash() -> str:
    h = hashlib.sha256()
    h.update(json.dumps(SPEC, sort_keys=True).encode())
    h.update(GEN.read_bytes())
    h.update(realvllm.recipe_hash().encode())
    for t in TEXTS:
        h.update(t.name.encode())
        h.update(t.read_bytes())
    return h.hexdigest()[:16]


def arch_entry() -> dict[str, object]:
    """The ``arch`` of a ``models:`` entry (what pre-flight uses before the files are read)."""
    s = SPEC
    head_dim = s["hidden"] // s["heads"]
    params = (
        2 * s["vocab"] * s["hidden"]
        + s["hidden"]
        + s["layers"]
        * (
            2 * s["hidden"]
            + s["hidden"] * head_dim * (2 * s["heads"] + 2 * s["kv_heads"])
            + 3 * s["hidden"] * s["intermediate"]
        )
    )
    return {
        "layers": s["layers"],
        "hidden_size": s["hidden"],
        "attention_heads": s["heads"],
        "kv_heads": s["kv_heads"],
        "head_dim": head_dim,
        "vocab": s["vocab"],
        "params": params,
        "dtype": "bfloat16",
    }


def model_dir(cache_root: Path | None = None) -> Path | None:
    d = (cache_root or realvllm.CACHE_ROOT) / "models" / f"{NAME}-{recipe_hash()}"
    return d if (d / STAMP).is_file() else None


def make(
    cache_root: Path | None = None, emit: Callable[[str], None] = lambda _m: None, out: Path | None = None
) -> Path:
    """The model directory, made if missing.  Needs the real engine installed (its python).
    ``out``: write a fresh copy there instead (no cache; to check the bytes are reproducible)."""
    root = cache_root or realvllm.CACHE_ROOT
    done = model_dir(root)
    if done and out is None:
        return done
    eng = realvllm.installed(root)
    if eng is None:
        raise LabError("tiny real model: the real vLLM engine is not installed (scripts/install-real-vllm)")
    missing = [str(t) for t in TEXTS if not t.is_file()]
    if missing:
        raise LabError(f"tiny real model: training text missing: {', '.join(missing)}")
    models = root / "models"
    models.mkdir(parents=True, exist_ok=True)
    final = out or models / f"{NAME}-{recipe_hash()}"
    build = final.parent / f".build-{final.name}-{os.getpid()}"
    shutil.rmtree(build, ignore_errors=True)
    emit(f"tiny real model: writing {final}")
    env = dict(
        os.environ, RAYON_NUM_THREADS="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONHASHSEED="0"
    )
    proc = subprocess.run(
        [str(eng.python), str(GEN), str(build), json.dumps(SPEC), *map(str, TEXTS)],
        capture_output=True,
        text=True,
        env=env,
    )
    if proc.returncode != 0:
        shutil.rmtree(build, ignore_errors=True)
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise LabError(f"tiny real model: generator failed (exit {proc.returncode}):\n{tail}")
    for f in build.iterdir():
        os.chmod(f, 0o644)  # read by the engine's own user in lab hosts (safetensors writes 0600)
    os.chmod(build, 0o755)
    (build / STAMP).write_text(json.dumps(file_hashes(build), indent=1, sort_keys=True) + "\n")
    if final.exists():
        shutil.rmtree(final)
    os.replace(build, final)
    return final


def file_hashes(d: Path) -> dict[str, str]:
    """sha256 of every file of a model directory (the stamp excluded)."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(d.iterdir())
        if p.is_file() and p.name != STAMP
    }
