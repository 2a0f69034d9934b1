"""Pipeline stages of a multi-node replica, for pre-flight's memory arithmetic (pure).

A replica across hosts runs one pipeline stage per host (docs/multinode.md): stage R holds a
contiguous slice of the decoder layers and tensor-parallel shards of them over its host's GPUs.
vLLM (0.32 wheel, ``vllm/distributed/utils.py`` ``get_pp_indices``) splits ``L`` layers into
``PP`` partitions of ``L // PP`` and gives the ``L % PP`` left over one each to the partitions
before the last (``partitions[-2]``, ``[-3]``, ...: the last holds the final norm and the LM
head); ``VLLM_PP_LAYER_PARTITION`` (comma-separated counts) overrides it.  The first stage
holds the input embedding, the last the LM head (with tied embeddings the last stage loads the
embedding matrix as its LM head too: both hold it).

What each stage's GPUs then hold, per TP rank (the same semantics as one host, ``memory.predict``):

* weights: the stage's share of the per-layer tensors (``layers / L`` of the checkpoint's
  non-vocab bytes), plus the embedding on the first stage and the LM head on the last;
* KV cache: the stage's own layers only (per token ``layers / L`` of the whole model's), so one
  ``max_model_len`` request must fit on every stage, and vLLM sizes the cache to the smallest
  stage's block count (its engine takes the minimum over workers);
* activation: the profile run's hidden states on every stage; the logits (``max_num_seqs x
  vocab`` floats) only on the last;
* non-torch: NCCL's buffers on every rank (the world is TP x PP > 1, even with TP 1 per host),
  the rank-0 extra on the head's first GPU only;
* CUDA graphs: per layer, so the stage's layers.

The layer kinds of a hybrid model (sliding, linear) are split in proportion (the config gives
their counts, not always their order): pre-flight says so with a WARN.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from clusterctl.deploy.preflight import memory as M

#: vLLM's environment variable overriding the pipeline split (comma-separated layer counts).
PARTITION_ENV = "VLLM_PP_LAYER_PARTITION"


@dataclass(frozen=True)
class Stage:
    """Pipeline stage ``rank`` of ``count``: layers ``first_layer`` .. ``first_layer + layers - 1``
    of ``total_layers``; ``world`` = TP x PP."""

    rank: int
    count: int
    first_layer: int
    layers: int
    total_layers: int
    world: int

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.count - 1

    def describe(self) -> str:
        return (
            f"pipeline stage {self.rank} of {self.count}: layers {self.first_layer}-"
            f"{self.first_layer + self.layers - 1} of {self.total_layers}"
        )


def partition(layers: int, pp: int, override: str | None = None) -> list[int]:
    """Layers per stage as vLLM splits them (module doc); raises ``ValueError`` for an override that
    is not ``pp`` integers summing to ``layers`` (vLLM refuses it too)."""
    if override is not None:
        try:
            parts = [int(x) for x in override.split(",")]
        except ValueError:
            raise ValueError(f"{PARTITION_ENV}={override!r} is not a comma-separated list of layer counts") from None
        if len(parts) != pp or sum(parts) != layers or min(parts) < 0:
            raise ValueError(f"{PARTITION_ENV}={override!r}: needs {pp} counts summing to the model's {layers} layers")
        return parts
    parts = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        parts[-i] += 1
    return parts


def stages(layers: int, pp: int, tp: int, override: str | None = None) -> list[Stage]:
    """Every stage of a replica of ``pp`` hosts with ``tp`` GPUs each over a model of ``layers`` layers."""
    parts = partition(layers, pp, override)
    return [Stage(r, pp, sum(parts[:r]), n, layers, tp * pp) for r, n in enumerate(parts)]


def stage_shape(shape: M.ModelShape, stage: Stage) -> M.ModelShape:
    """The model as one stage sees it: its layers, the layer kinds in proportion."""
    n, total = stage.layers, shape.layers
    sliding = round(shape.sliding_layers * n / total) if total else 0
    linear = round(shape.linear_layers * n / total) if total else 0
    full = None if shape.full_layers is None else max(0, n - sliding - linear)
    return replace(shape, layers=n, sliding_layers=sliding, linear_layers=linear, full_layers=full)


def stage_weights(weights: M.WeightSizes, stage: Stage) -> M.WeightSizes:
    """The stage's weights: its share of the per-layer tensors, the embedding on the first stage, the
    LM head on the last (one vocab tensor: tied embeddings, held by both ends)."""
    n, total = stage.layers, max(1, stage.total_layers)

    def share(b: int) -> int:
        return b * n // total

    vocab: tuple[tuple[int, int], ...] = ()
    if weights.vocab:
        ends = [weights.vocab[0]] if stage.is_first else []
        if stage.is_last:
            ends.append(weights.vocab[-1])
        vocab = tuple(ends)
    return replace(
        weights,
        replicated=share(weights.replicated),
        split=share(weights.split),
        split_linear=share(weights.split_linear),
        kv=share(weights.kv),
        kv_linear=share(weights.kv_linear),
        vocab=vocab,
    )


def adjust(budget: M.Budget, shape: M.ModelShape, settings: M.Settings, stage: Stage) -> M.Budget:
    """``memory.predict``'s budget for a stage's TP group, corrected for what differs across stages
    (module doc): no logits before the last stage, NCCL buffers on every rank, the rank-0 extra
    only on the head's first GPU.  The available KV memory and block counts follow."""
    tp = len(budget.ranks)
    logits = (
        0
        if stage.is_last
        else min(settings.max_num_seqs, settings.max_num_batched_tokens) * M.cdiv(shape.vocab, tp) * tp * 4
    )
    page = budget.layer_bytes_per_token * budget.block_size * budget.groups()[0]
    ranks = []
    for r in budget.ranks:
        nt = M.non_torch(stage.world, r.rank if stage.is_first else 1)
        act = max(0, r.activation - logits)
        avail = (
            r.available_kv
            if settings.kv_cache_memory_bytes is not None
            else r.available_kv + (r.activation - act) + (r.non_torch - nt)
        )
        ranks.append(
            replace(
                r, activation=act, non_torch=nt, available_kv=avail, num_blocks=max(0, avail) // page if page else 0
            )
        )
    return replace(budget, ranks=tuple(ranks))
