"""The engine start-up: model config, GPU memory arithmetic against NVML, vLLM's log lines.

:func:`start_engine` runs the sequence vLLM logs (config, workers, weight
loading, torch.compile, memory profiling, KV cache, CUDA graphs), registering
the memory it would hold on each simulated GPU as it goes.  A failure raises
:class:`StartupFailure` carrying vLLM's exception line; :func:`report_failure`
prints it with the traceback shape vLLM prints.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import gpu, memory as M, residency, synth
from .logs import Log

GiB, MiB = M.GiB, M.MiB
#: Loading rates (bytes/s): model files already in the page cache, and cold from disk.
HOT_BPS = 3.5 * GiB
COLD_BPS = 1.0 * GiB
#: Checkpoints up to this size are read for real while "loading" (page-cache effects);
#: larger (sparse) ones only have their residency measured.
READ_LIMIT = 256 * MiB
COMPILE_S = 10.2
GRAPH_CAPTURE_S = 12.0
PROFILE_S = 2.0


class StartupFailure(Exception):
    """Start-up failed as vLLM would: ``exc`` is the exception line, ``where`` the raising frame."""

    def __init__(
        self,
        exc: str,
        *,
        where: str = "engine",
        frames: list[tuple[str, int, str, str]] | None = None,
        pre: list[tuple[str, str, str]] | None = None,
    ) -> None:
        super().__init__(exc)
        self.exc = exc
        self.where = where  # "api" (frontend), "engine" (EngineCore), "worker"
        self.frames = frames or []  # (file under vllm/, line, function, source)
        self.pre = pre or []  # ERROR lines logged before the traceback (proc, where, msg)


@dataclass
class EngineInfo:
    """What start-up resolved: the numbers the server and /metrics need."""

    version: str
    model: str
    served_names: list[str]
    max_model_len: int
    vocab: int
    kv_tokens: int
    num_blocks: int
    block_size: int
    kv_dtype: str
    util: float
    prefix_caching: bool
    gpus: list[int]
    usage: dict[int, int] = field(default_factory=dict)
    plan: M.Plan | None = None
    default_temperature: float = 1.0
    max_logprobs: int = 20
    # What the step engine (part 2) needs: scheduler budget, parallelism, hardware, quantization.
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    tp: int = 1
    gpu_name: str = ""
    quantization: str | None = None
    shape: M.ModelShape | None = None


def _fmt_torch(n: float) -> str:
    """PyTorch's size format in OOM messages."""
    if n < 1024:
        return f"{int(n)} bytes"
    if n < MiB:
        return f"{n / 1024:.2f} KiB"
    if n < GiB:
        return f"{n / MiB:.2f} MiB"
    return f"{n / GiB:.2f} GiB"


def resolve_dtype(flag: str, cfg: dict[str, Any]) -> str:
    if flag == "auto":
        d = str(cfg.get("torch_dtype", "bfloat16"))
        return "bfloat16" if d == "float32" else d
    return {"half": "float16", "float": "float32"}.get(flag, flag)


def load_config(model: str) -> tuple[Path, dict[str, Any]]:
    path = Path(model)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise StartupFailure(
            f"ValueError: Invalid repository ID or local directory specified: '{model}'.\n"
            "Please verify the following requirements:\n"
            "1. Provide a valid Hugging Face repository ID.\n"
            "2. Specify a local directory that contains a recognized configuration file.\n"
            "   - For Hugging Face models: ensure the presence of a 'config.json'.\n"
            "   - For Mistral models: ensure the presence of a 'params.json'.",
            where="api",
            frames=[("transformers_utils/config.py", 508, "get_config", "raise ValueError(error_message)")],
        )
    try:
        return path, json.loads(cfg_file.read_text())
    except ValueError as e:
        raise StartupFailure(
            f"json.decoder.JSONDecodeError: {e}",
            where="api",
            frames=[
                (
                    "transformers_utils/config.py",
                    470,
                    "get_config",
                    "config_dict, _ = PretrainedConfig.get_config_dict(",
                )
            ],
        ) from None


class Starter:
    """One start-up; ``sleep`` is scaled by the time-scale factor."""

    def __init__(self, ns: Any, version: str, env: dict[str, str], log: Log, sleep: Callable[[float], None]) -> None:
        self.ns, self.version, self.env, self.log, self.sleep = ns, version, env, log, sleep
        self.full = {"0.11": "0.11.0", "0.33": "0.33.0"}[version]
        self.engine_proc = "EngineCore_DP0" if version == "0.11" else "EngineCore"
        self.state = gpu.state_path(env)
        self.usage: dict[int, int] = {}

    # -- helpers
    def worker(self, rank: int) -> str:
        return self.engine_proc if self.ns.tensor_parallel_size == 1 else f"Worker_TP{rank}"

    def register(self, per_rank: dict[int, int]) -> None:
        self.usage = {self.gpus[r]: b for r, b in per_rank.items()}
        try:
            gpu.register(self.state, self.usage)
        except (OSError, ValueError) as e:
            self.log.warning(self.engine_proc, "sim", f"cannot register GPU memory in {self.state}: {e}")

    # -- the sequence
    def run(self) -> EngineInfo:
        ns, log = self.ns, self.log
        mdir, cfg = load_config(ns.model)
        try:
            shape = M.ModelShape.from_config(cfg)
        except (KeyError, TypeError, ValueError) as e:
            raise StartupFailure(
                f"ValueError: {mdir / 'config.json'}: missing or invalid field {e}",
                where="api",
                frames=[("config/model.py", 540, "__post_init__", "self.hf_config = get_config(")],
            ) from None
        tp = ns.tensor_parallel_size
        if tp < 1:
            raise StartupFailure(
                f"ValueError: tensor_parallel_size must be a positive integer, got {tp}",
                where="api",
                frames=[("config/parallel.py", 470, "__post_init__", "raise ValueError(")],
            )
        if not 0 < ns.gpu_memory_utilization <= 1.0:
            raise StartupFailure(
                f"ValueError: GPU memory utilization must be less than 1.0. Got {ns.gpu_memory_utilization}."
                if ns.gpu_memory_utilization > 1.0
                else f"ValueError: GPU memory utilization must be greater than 0. Got {ns.gpu_memory_utilization}.",
                where="api",
                frames=[("config/cache.py", 180, "_verify_args", "raise ValueError(")],
            )
        dtype = resolve_dtype(ns.dtype, cfg)
        qcfg = (cfg.get("quantization_config") or {}).get("quant_method")
        if qcfg and ns.quantization and ns.quantization != qcfg and not ns.quantization.startswith(qcfg):
            raise StartupFailure(
                f"ValueError: Quantization method specified in the model config ({qcfg}) does not match "
                f"the quantization method specified in the `quantization` argument ({ns.quantization}).",
                where="api",
                frames=[("config/model.py", 1010, "_verify_quantization", "raise ValueError(")],
            )
        quant = ns.quantization or qcfg
        if ns.quantization in ("awq", "gptq") and not qcfg:
            raise StartupFailure(
                f"ValueError: Cannot find the config file for {ns.quantization}",
                where="api",
                frames=[("model_executor/model_loader/weight_utils.py", 208, "get_quant_config", "raise ValueError(")],
            )
        if shape.heads % tp:
            raise StartupFailure(
                f"ValueError: Total number of attention heads ({shape.heads}) must be divisible by "
                f"tensor parallel size ({tp}).",
                where="api",
                frames=[("config/model.py", 1049, "verify_with_parallel_config", "raise ValueError(")],
            )
        derived = shape.max_position
        mml = ns.max_model_len
        if mml is not None and mml > derived and mml != -1 and self.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != "1":
            raise StartupFailure(
                f"ValueError: User-specified max_model_len ({mml}) is greater than the derived max_model_len "
                f"(max_position_embeddings={derived} or model_max_length=None in model's config.json). To allow "
                "overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. "
                "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. If the model uses relative "
                "position encoding (RoPE), positions exceeding derived_max_model_len lead to nan. If the model "
                "uses absolute position encoding, positions exceeding derived_max_model_len will cause a CUDA "
                "array out-of-bounds error.",
                where="api",
                frames=[("config/model.py", 1911, "_get_and_verify_max_len", "raise ValueError(")],
            )
        auto_len = mml == -1
        mml = derived if (mml is None or auto_len) else mml

        # NVML: which GPUs, how big.
        try:
            nv = gpu.Nvml()
            self.gpus = gpu.visible_devices(self.env, nv)
            infos = [nv.info(i) for i in self.gpus]
        except gpu.GpuError as e:
            raise StartupFailure(
                str(e),
                where="api",
                frames=[("platforms/__init__.py", 222, "resolve_current_platform_cls_qualname", "raise RuntimeError(")],
            ) from None
        if not infos:
            raise StartupFailure(
                "RuntimeError: Failed to infer device type",
                where="api",
                frames=[("engine/arg_utils.py", 1370, "create_engine_config", "device_config = DeviceConfig(")],
            )
        if len(infos) < tp:
            raise StartupFailure(
                f"ValueError: World size ({tp}) is larger than the number of available GPUs ({len(infos)}) "
                "in this node. If this is intentional and you are using: - ray, set '--distributed-executor-"
                "backend ray'. - multiprocessing, set '--nnodes' appropriately.",
                where="api",
                frames=[("config/parallel.py", 489, "__post_init__", "raise ValueError(")],
            )
        total_gib = infos[0].total / GiB
        big = total_gib >= 70 and "A100" not in infos[0].name
        if self.version == "0.33" and total_gib >= 160:
            d_seqs, d_tokens = 1024, 16384
        elif big:
            d_seqs, d_tokens = 1024, 8192
        else:
            d_seqs, d_tokens = 256, 2048
        max_seqs = ns.max_num_seqs or d_seqs
        max_tokens = ns.max_num_batched_tokens or d_tokens
        arch = shape.architecture
        log.info("APIServer", "model.py:547", f"Resolved architecture: {arch}")
        log.info("APIServer", "model.py:1510", f"Using max model len {mml}")
        log.info(
            "APIServer", "scheduler.py:205", f"Chunked prefill is enabled with max_num_batched_tokens={max_tokens}."
        )
        self.sleep(6.0)
        kv_dtype = ns.kv_cache_dtype
        kv_bytes = (
            M.KV_DTYPE_BYTES.get(kv_dtype, M.DTYPE_BYTES.get(dtype, 2))
            if kv_dtype != "auto"
            else M.DTYPE_BYTES.get(dtype, 2)
        )
        served = ns.served_model_name or [ns.model]
        prefix = ns.enable_prefix_caching if ns.enable_prefix_caching is not None else True
        self.log.info(
            self.engine_proc,
            "core.py:77",
            f"Initializing a V1 LLM engine (v{self.full}) with config: model='{ns.model}', "
            f"speculative_config=None, tokenizer='{ns.model}', skip_tokenizer_init=False, "
            f"tokenizer_mode=auto, revision=None, tokenizer_revision=None, trust_remote_code="
            f"{bool(ns.trust_remote_code)}, dtype=torch.{dtype}, max_seq_len={mml}, download_dir="
            f"{ns.download_dir!r}, load_format={ns.load_format}, tensor_parallel_size={tp}, "
            f"pipeline_parallel_size={ns.pipeline_parallel_size}, data_parallel_size="
            f"{ns.data_parallel_size}, disable_custom_all_reduce=False, quantization={quant}, "
            f"enforce_eager={bool(ns.enforce_eager)}, kv_cache_dtype={kv_dtype}, device_config=cuda, "
            f"seed={ns.seed}, served_model_name={served[0]}, enable_prefix_caching={prefix}, "
            "chunked_prefill_enabled=True, pooler_config=None",
        )
        for r in range(tp):
            log.info(
                self.worker(r),
                "parallel_state.py:1208",
                f"rank {r} in world size {tp} is assigned as DP rank 0, PP rank 0, TP rank {r}, EP rank 0",
            )
        self.sleep(2.0)

        # CUDA context, then the start-up free-memory check (per rank, on its own GPU).
        self.register({r: M.CUDA_CONTEXT_BYTES for r in range(tp)})
        util = ns.gpu_memory_utilization
        ranks: list[M.RankPlan] = []
        for r in range(tp):
            info = nv.info(self.gpus[r])
            req = M.requested_bytes(info.total, util, self.version)
            if ns.kv_cache_memory_bytes is None and info.free < req:
                dev = "" if self.version == "0.11" else f" cuda:{r}"
                raise StartupFailure(
                    f"ValueError: Free memory on device{dev} ({info.free / GiB:.2f}/{info.total / GiB:.2f} GiB) on "
                    f"startup is less than desired GPU memory utilization ({util}, {req / GiB:.2f} GiB). Decrease "
                    "GPU memory utilization or reduce GPU memory used by other processes.",
                    where="worker",
                    frames=[
                        (
                            "v1/worker/gpu_worker.py",
                            186 if self.version == "0.11" else 245,
                            "init_device",
                            "raise ValueError("
                            if self.version == "0.11"
                            else "self.requested_memory = request_memory(init_snapshot, self.cache_config)",
                        )
                    ]
                    + (
                        []
                        if self.version == "0.11"
                        else [("v1/worker/utils.py", 765, "request_memory", "raise ValueError(")]
                    ),
                )
            ranks.append(
                M.RankPlan(
                    rank=r,
                    gpu=self.gpus[r],
                    total=info.total,
                    free=info.free,
                    requested=req,
                    weights=0,
                    activation=0,
                    non_torch=0,
                    graphs=0,
                    available_kv=0,
                    num_blocks=0,
                )
            )

        # Weights.
        for r in range(tp):
            log.info(self.worker(r), "gpu_model_runner.py:2602", f"Starting to load model {ns.model}...")
        for r in range(tp):
            log.info(self.worker(r), "cuda.py:325", "Using Flash Attention backend on V1 engine.")
        try:
            tensors = [(n, synth.nbytes(d, s), s) for n, d, s in synth.iter_tensors(mdir)]
        except (ValueError, OSError, KeyError) as e:
            raise StartupFailure(
                f"safetensors_rust.SafetensorError: Error while deserializing header: {e}",
                where="worker",
                frames=[
                    (
                        "model_executor/model_loader/weight_utils.py",
                        500,
                        "safetensors_weights_iterator",
                        "with safe_open(st_file, framework=\"pt\") as f:",
                    )
                ],
            ) from None
        if not tensors:
            raise StartupFailure(
                f"RuntimeError: Cannot find any model weights with `{ns.model}`",
                where="worker",
                frames=[
                    ("model_executor/model_loader/default_loader.py", 170, "_prepare_weights", "raise RuntimeError(")
                ],
            )
        if ns.quantization == "fp8" and not qcfg:  # online FP8: linear weights stored in 1 byte
            tensors = [(n, b // 2 if n.endswith("proj.weight") else b, s) for n, b, s in tensors]
        per_tensor = M.weights_per_rank(tensors, shape, tp)
        weights = sum(per_tensor)
        for rp in ranks:
            self._check_weights_fit(rp, per_tensor, quant)
            rp.weights = weights
        files = sorted(mdir.glob("*.safetensors"))
        load_s = self._load_time(files)
        n = len(files)
        lead = self.worker(0)
        log.raw(lead, f"Loading safetensors checkpoint shards:   0% Completed | 0/{n} [00:00<?, ?it/s]")
        self.sleep(load_s)
        rate = n / load_s if load_s > 0 else float(n)
        mm, ss = divmod(int(load_s), 60)
        speed = f"{rate:5.2f}it/s" if rate >= 1 else f"{1 / rate:5.2f}s/it"  # as tqdm writes it
        log.raw(
            lead, f"Loading safetensors checkpoint shards: 100% Completed | {n}/{n} [{mm:02d}:{ss:02d}<00:00, {speed}]"
        )
        log.raw(lead, "")
        self.register({r: M.CUDA_CONTEXT_BYTES + weights for r in range(tp)})
        for r in range(tp):
            log.info(self.worker(r), "default_loader.py:267", f"Loading weights took {load_s:.2f} seconds")
        for r in range(tp):
            if self.version == "0.11":
                log.info(
                    self.worker(r),
                    "gpu_model_runner.py:2653",
                    f"Model loading took {weights / GiB:.4f} GiB and {load_s + 0.8:.6f} seconds",
                )
            else:
                log.info(
                    self.worker(r),
                    "gpu_model_runner.py:5088",
                    f"Model loading took {weights / GiB:.2f} GiB memory and {load_s + 0.8:.6f} seconds",
                )

        if not ns.enforce_eager:
            for r in range(tp):
                log.info(
                    self.worker(r),
                    "backends.py:548",
                    f"Using cache directory: /root/.cache/vllm/torch_compile_cache/sim/rank_{r}_0/backbone "
                    "for vLLM's torch.compile",
                )
                log.info(self.worker(r), "backends.py:559", "Dynamo bytecode transform time: 6.48 s")
            self.sleep(COMPILE_S)
            for r in range(tp):
                log.info(self.worker(r), "monitor.py:34", f"torch.compile takes {COMPILE_S:.2f} s in total")

        # Profiling.
        act = M.activation_peak(shape, tp, max_tokens, max_seqs, M.DTYPE_BYTES.get(dtype, 2))
        self.sleep(PROFILE_S)
        bs = ns.block_size or M.BLOCK_SIZE  # vLLM honours --block-size (its CPU backend defaults to 128)
        page_layers = M.page_size(shape, tp, kv_bytes, bs) * shape.layers
        graphs = M.graph_memory(shape, bool(ns.enforce_eager))
        if self.version == "0.33" and not ns.enforce_eager:
            log.info(lead, "gpu_worker.py:402", "CUDA graph memory profiling is enabled (default since v0.21.0)")
            log.info(lead, "gpu_worker.py:431", f"Estimated CUDA graph memory: {graphs * tp / GiB:.2f} GiB total")
        for rp in ranks:
            rp.activation, rp.non_torch, rp.graphs = act, M.non_torch(tp, rp.rank), graphs
            if ns.kv_cache_memory_bytes is not None:
                rp.available_kv = ns.kv_cache_memory_bytes
            else:
                rp.available_kv = M.available_kv(rp.requested, rp.weights, act, rp.non_torch, graphs, self.version)
            rp.num_blocks = max(0, rp.available_kv) // page_layers
        self.register({rp.rank: M.CUDA_CONTEXT_BYTES + rp.weights + act + rp.non_torch for rp in ranks})
        for rp in ranks:
            log.info(
                self.worker(rp.rank), "gpu_worker.py:298", f"Available KV cache memory: {rp.available_kv / GiB:.2f} GiB"
            )
        per_token = M.kv_bytes_per_token(shape, tp, kv_bytes)
        worst = min(ranks, key=lambda x: x.available_kv)
        if worst.available_kv <= 0:
            raise StartupFailure(
                "ValueError: No available memory for the cache blocks. Try increasing "
                "`gpu_memory_utilization` when initializing the engine.",
                where="engine",
                frames=_KV_FRAMES,
            )
        if auto_len:
            est = M.estimate_max_model_len(worst.available_kv, per_token, bs)
            if est < bs:
                raise StartupFailure(
                    "ValueError: Cannot auto-fit max_model_len: not enough GPU memory "
                    "available to serve even a single token. Try increasing "
                    "`gpu_memory_utilization`.",
                    where="engine",
                    frames=_KV_FRAMES,
                )
            mml = min(mml, est)
            log.info(self.engine_proc, "kv_cache_utils.py:812", f"Auto-fit max_model_len: {mml}")
        needed = M.cdiv(mml, bs) * bs * per_token
        if needed > worst.available_kv:
            est = M.estimate_max_model_len(worst.available_kv, per_token, bs)
            if self.version == "0.11":
                msg = (
                    f"ValueError: To serve at least one request with the models's max seq len ({mml}), "
                    f"({needed / GiB:.2f} GiB KV cache is needed, which is larger than the available KV cache "
                    f"memory ({worst.available_kv / GiB:.2f} GiB). Based on the available memory, the estimated "
                    f"maximum model length is {est}. Try increasing `gpu_memory_utilization` or decreasing "
                    "`max_model_len` when initializing the engine."
                )
            else:
                msg = (
                    f"ValueError: To serve at least one request with the model's max seq len ({mml}), "
                    f"({needed / GiB:.2f} GiB KV cache is needed, which is larger than the available KV cache "
                    f"memory ({worst.available_kv / GiB:.2f} GiB). Based on the available memory, the estimated "
                    f"maximum model length is {est}. Try increasing `gpu_memory_utilization` (which also "
                    "controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing "
                    "the engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more "
                    "details."
                )
            raise StartupFailure(msg, where="engine", frames=_KV_FRAMES)

        plan = M.Plan(ranks=ranks, kv_per_token=per_token, block_size=bs)
        for rp in ranks:
            toks = rp.num_blocks * bs
            conc = rp.num_blocks / M.cdiv(mml, bs)
            if self.version == "0.11":
                log.info(self.engine_proc, "kv_cache_utils.py:1087", f"GPU KV cache size: {toks:,} tokens")
                log.info(
                    self.engine_proc,
                    "kv_cache_utils.py:1091",
                    f"Maximum concurrency for {mml:,} tokens per request: {conc:.2f}x",
                )
        if self.version == "0.33":
            log.info(
                self.engine_proc,
                "kv_cache_utils.py:1155",
                f"GPU KV cache size: {plan.kv_tokens:,} tokens, Maximum concurrency for {mml:,} tokens "
                f"per request: {plan.max_concurrency(mml):.2f}x",
            )
        kv_alloc = plan.num_blocks * page_layers
        if not ns.enforce_eager:
            log.raw(
                lead,
                "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|██████████| 67/67 "
                "[00:07<00:00,  8.93it/s]",
            )
            log.raw(lead, "Capturing CUDA graphs (decode, FULL): 100%|██████████| 67/67 [00:04<00:00, 14.71it/s]")
            self.sleep(GRAPH_CAPTURE_S)
            for rp in ranks:
                log.info(
                    self.worker(rp.rank),
                    "gpu_model_runner.py:3480",
                    f"Graph capturing finished in {int(GRAPH_CAPTURE_S)} secs, took {graphs / GiB:.2f} GiB",
                )
        self.register(
            {rp.rank: M.CUDA_CONTEXT_BYTES + rp.weights + act + rp.non_torch + kv_alloc + graphs for rp in ranks}
        )
        init_s = PROFILE_S + (0 if ns.enforce_eager else COMPILE_S + GRAPH_CAPTURE_S + 1.5)
        log.info(
            self.engine_proc,
            "core.py:210",
            f"init engine (profile, create kv cache, warmup model) took {init_s:.2f} seconds",
        )
        gen_cfg = mdir / "generation_config.json"
        temp = 1.0
        try:
            temp = float(json.loads(gen_cfg.read_text()).get("temperature", 1.0))
        except (OSError, ValueError, TypeError):
            pass
        return EngineInfo(
            version=self.version,
            model=ns.model,
            served_names=served,
            max_model_len=mml,
            vocab=shape.vocab,
            kv_tokens=plan.kv_tokens,
            num_blocks=plan.num_blocks,
            block_size=bs,
            kv_dtype=kv_dtype,
            util=util,
            prefix_caching=prefix,
            gpus=self.gpus,
            usage=dict(self.usage),
            plan=plan,
            default_temperature=temp,
            max_logprobs=ns.max_logprobs,
            max_num_seqs=max_seqs,
            max_num_batched_tokens=max_tokens,
            tp=tp,
            gpu_name=infos[0].name,
            quantization=quant,
            shape=shape,
        )

    def _check_weights_fit(self, rp: M.RankPlan, per_tensor: list[int], quant: str | None) -> None:
        free = rp.free  # measured after our CUDA context was registered
        used = 0
        for b in per_tensor:
            if used + b > free:
                others = gpu.other_processes(self.state, rp.gpu)
                mine = M.CUDA_CONTEXT_BYTES + used
                procs = "".join(f"Process {pid} has {_fmt_torch(size)} memory in use. " for pid, size in others)
                torch_msg = (
                    f"CUDA out of memory. Tried to allocate {_fmt_torch(b)}. GPU {rp.rank} has a total "
                    f"capacity of {_fmt_torch(rp.total)} of which {_fmt_torch(free - used)} is free. "
                    f"{procs}Including non-PyTorch memory, this process has {_fmt_torch(mine)} memory in "
                    f"use. Of the allocated memory {_fmt_torch(used)} is allocated by PyTorch, and "
                    "0 bytes is reserved by PyTorch but unallocated. If reserved but unallocated memory "
                    "is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
                    "fragmentation.  See documentation for Memory Management  "
                    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
                )
                pre: list[tuple[str, str, str]] = []
                if quant is None:
                    pre.append(
                        (
                            self.worker(rp.rank),
                            "linear.py:210",
                            f"Failed to create unquantized linear weights: {torch_msg}",
                        )
                    )
                    exc = (
                        "RuntimeError: Failed to create unquantized linear weights. This may be caused by "
                        "insufficient memory to allocate the weight."
                    )
                    frames = [("model_executor/layers/linear.py", 219, "create_weights", "raise RuntimeError(")]
                else:
                    exc = f"torch.OutOfMemoryError: {torch_msg}"
                    frames = [("model_executor/parameter.py", 41, "__new__", "data = torch.empty(")]
                if self.version == "0.33":
                    pre.append(
                        (
                            self.worker(rp.rank),
                            "gpu_model_runner.py:5077",
                            "Failed to load model - not enough GPU memory. Try lowering "
                            "--gpu-memory-utilization to free memory for weights, increasing "
                            "--tensor-parallel-size, or using --quantization. See "
                            "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more tips. "
                            f"(original error: {torch_msg})",
                        )
                    )
                raise StartupFailure(exc, where="worker", frames=frames, pre=pre)
            used += b

    def _load_time(self, files: list[Path]) -> float:
        total = resident = 0
        for f in files:
            try:
                r, s = residency.resident_bytes(str(f))
            except OSError:
                r, s = 0, f.stat().st_size
            resident += r
            total += s
        secs = resident / HOT_BPS + (total - resident) / COLD_BPS
        if total <= READ_LIMIT:  # small checkpoints are really read (page cache as vLLM leaves it)
            for f in files:
                with open(f, "rb") as fh:
                    while fh.read(1 << 20):
                        pass
        return secs


_KV_FRAMES = [
    (
        "v1/engine/core.py",
        199,
        "_initialize_kv_caches",
        "kv_cache_configs = get_kv_cache_configs(vllm_config, kv_cache_specs,",
    ),
    (
        "v1/core/kv_cache_utils.py",
        1243,
        "get_kv_cache_configs",
        "check_enough_kv_cache_memory(vllm_config, kv_cache_spec_one_worker,",
    ),
    ("v1/core/kv_cache_utils.py", 716, "check_enough_kv_cache_memory", "raise ValueError("),
]


def report_failure(log: Log, f: StartupFailure, version: str, tp: int) -> None:
    """Print ``f`` as vLLM does: ERROR lines + traceback in the failing process, then the frontend's."""
    site = _site_packages()
    engine = "EngineCore_DP0" if version == "0.11" else "EngineCore"

    def tb(frames: list[tuple[str, int, str, str]]) -> list[str]:
        out = ["Traceback (most recent call last):"]
        for file, line, fn, src in frames:
            out += [f'  File "{site}/vllm/{file}", line {line}, in {fn}', f"    {src}"]
        return out

    for proc, where, msg in f.pre:
        log.error(proc, where, msg)
    if f.where == "api":
        log.raw(
            "APIServer",
            "\n".join(
                tb([("entrypoints/cli/main.py", 54, "main", "args.dispatch_function(args)"), *f.frames]) + [f.exc]
            ),
        )
        return
    core = [
        ("v1/engine/core.py", 699, "run_engine_core", "engine_core = EngineCoreProc(*args, **kwargs)"),
        ("v1/engine/core.py", 498, "__init__", "super().__init__(vllm_config, executor_class, log_stats,"),
    ]
    if f.where == "worker" and tp > 1:
        wproc = "Worker_TP0"
        log.error(wproc, "multiproc_executor.py:597", "WorkerProc failed to start.")
        for line in tb(
            [
                ("v1/executor/multiproc_executor.py", 571, "worker_main", "worker = WorkerProc(*args, **kwargs)"),
                *f.frames,
            ]
        ) + [f.exc]:
            log.error(wproc, "multiproc_executor.py:597", line)
        exc = (
            "Exception: WorkerProc initialization failed due to an exception in a background process. "
            "See stack trace for root cause."
        )
        frames = core + [
            (
                "v1/executor/multiproc_executor.py",
                106,
                "_init_executor",
                "self.workers = WorkerProc.wait_for_ready(unready_workers)",
            ),
            ("v1/executor/multiproc_executor.py", 509, "wait_for_ready", "raise e from None"),
        ]
    else:
        exc = f.exc
        frames = (
            core + f.frames
            if f.where == "engine"
            else core
            + [("v1/engine/core.py", 83, "__init__", "self.model_executor = executor_class(vllm_config)")]
            + f.frames
        )
    log.error(engine, "core.py:708", "EngineCore failed to start.")
    for line in "\n".join(tb(frames) + [exc]).split("\n"):
        log.error(engine, "core.py:708", line)
    log.raw(engine, f"Process {engine}:")
    log.raw(
        engine,
        "\n".join(
            tb([("/usr/lib/python3.12/multiprocessing/process.py", 314, "_bootstrap", "self.run()")]) + [exc]
        ).replace(f"{site}/vllm//usr", "/usr"),
    )
    log.raw(
        "APIServer",
        "\n".join(
            tb(
                [
                    ("entrypoints/cli/main.py", 54, "main", "args.dispatch_function(args)"),
                    (
                        "entrypoints/openai/api_server.py",
                        1884,
                        "run_server",
                        "await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)",
                    ),
                    (
                        "v1/engine/utils.py",
                        785,
                        "wait_for_engine_startup",
                        "raise RuntimeError(\"Engine core initialization failed. \"",
                    ),
                ]
            )
            + [
                "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
                + ("{}" if version == "0.11" else f"{{'{engine}': 1}}")
            ]
        ),
    )


def _site_packages() -> str:
    exe = Path(sys.argv[0]).resolve() if sys.argv and sys.argv[0] else Path("/opt/vllm/bin/vllm")
    prefix = exe.parent.parent if exe.parent.name == "bin" else Path("/opt/vllm")
    return f"{prefix}/lib/python3.12/site-packages"
