"""Render one vLLM instance as a systemd unit and its EnvironmentFile (pure, no I/O).

The unit (``clusterctl/templates/vllm-instance.service.j2``; anatomy in
docs/deploy-units.md) runs ``<engine> serve <model path>
--served-model-name N --host H --port P --tensor-parallel-size T <args>``
as the policy's ``User=`` after ``verify-model`` (Staging's contract) has
accepted the model path.  Every argument is quoted for systemd
(:mod:`clusterctl.deploy.units.sdquote`).  Secrets (``VLLM_API_KEY`` ...) go only
into the EnvironmentFile (mode 0600), never onto the command line: vLLM 0.11
prints its arguments in its log.

vLLM has no ``sd_notify``: systemd reports the unit active as soon as the
process runs.  Readiness (``/health``, ``/v1/models``, a one-token
completion) is polled by clusterctl, which owns the loading-time budget;
``TimeoutStartSec=`` bounds ``ExecStartPre`` and the exec.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined

from clusterctl.deploy import spec
from clusterctl.deploy.units.sdquote import command_line, env_file_line, environment_line
from clusterctl.deploy.units.secrets import looks_secret, secret_refs
from clusterctl.errors import ClusterctlError
from clusterctl.inventory.model import FabricProfile, Host, Instance, Inventory
from clusterctl.deploy.units.nodesetup import CHECK_GPUS_PATH
from clusterctl.stage.run import VERIFY_MODEL_PATH

TEMPLATE = "vllm-instance.service.j2"
RESTART_VALUES = ("no", "on-success", "on-failure", "on-abnormal", "on-watchdog", "on-abort", "always")
#: vLLM boolean flags that are plain ``store_true`` switches (no ``--no-`` form):
#: ``False`` leaves them out.  Every other boolean is argparse's
#: ``BooleanOptionalAction`` in vLLM >= 0.10, so ``False`` gives ``--no-FLAG``.
PLAIN_SWITCHES = frozenset(
    {
        "disable-log-stats",
        "disable-log-requests",
        "disable-frontend-multiprocessing",
        "headless",
        "sim-broken-quantization",
    }
)
#: Flags declared with ``action="append"``: a list repeats the flag per item.
#: Every other list is ``nargs="+"`` (``--served-model-name a b``): one flag, several values.
APPEND_FLAGS = frozenset({"middleware"})
#: Flags that would put a secret on the command line (visible in ``ps`` and vLLM's log).
SECRET_FLAGS = frozenset({"api-key"})
#: Flags clusterctl sets itself unless ``args`` gives them.
OVERRIDABLE = ("served-model-name", "host")
_FLAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: An NVML GPU UUID (``GPU-`` and hex groups; MIG instances are not placed by clusterctl).
_UUID = re.compile(r"^GPU-[0-9a-fA-F-]{8,64}$")


@dataclass(frozen=True)
class UnitPolicy:
    """How instance units behave; the same for every instance of a deploy on one host.

    Times are seconds.  ``restart`` is systemd's ``Restart=``: ``always``,
    because vLLM exits with status 0 when its engine dies (``on-failure``
    would leave it down); ``systemctl stop`` still stops it.
    ``restart_sec`` is the first delay before a restart.  ``restart_steps``
    > 0 (systemd >= 254, see :func:`policy_for_systemd`) makes the delay
    grow in that many steps up to ``restart_max_delay_s``.  systemd gives up
    (unit ``failed``) after ``start_limit_burst`` starts within the start
    limit interval; a broken model loads for minutes before it dies, so the
    interval is sized from ``load_time_s``: ``burst x (load_time_s + the
    longest delay)`` unless ``start_limit_interval_s`` is given (then it must
    exceed ``burst x restart_sec`` to ever trigger).  ``start_timeout_s``
    bounds ExecStartPre + exec (loading is polled by clusterctl, see the
    module doc); ``stop_timeout_s`` is the grace period after SIGTERM before
    SIGKILL.  ``extra_after`` adds ``After=`` units; ``bind_host`` is vLLM's
    ``--host``.
    """

    user: str = "vllm"
    enable_at_boot: bool = True
    restart: str = "always"
    restart_sec: int = 10
    restart_steps: int = 0
    restart_max_delay_s: int = 300
    start_limit_burst: int = 5
    start_limit_interval_s: int = 0
    load_time_s: int = 600
    start_timeout_s: int = 900
    stop_timeout_s: int = 120
    limit_nofile: int = 1048576
    extra_after: tuple[str, ...] = ()
    bind_host: str = "0.0.0.0"

    def __post_init__(self) -> None:
        if not _USER.match(self.user):
            raise ClusterctlError(f"unit policy: user {self.user!r} is not a valid user name")
        if self.restart not in RESTART_VALUES:
            raise ClusterctlError(f"unit policy: restart {self.restart!r} is not one of {', '.join(RESTART_VALUES)}")
        if self.start_limit_interval_s and self.start_limit_interval_s <= self.start_limit_burst * self.restart_sec:
            raise ClusterctlError(
                f"unit policy: start_limit_interval_s ({self.start_limit_interval_s}) must exceed "
                f"start_limit_burst x restart_sec ({self.start_limit_burst * self.restart_sec}), "
                "or the crash-loop guard never trips"
            )
        if self.restart_steps and self.restart_max_delay_s <= self.restart_sec:
            raise ClusterctlError(
                f"unit policy: restart_max_delay_s ({self.restart_max_delay_s}) must exceed "
                f"restart_sec ({self.restart_sec}) for the delay to grow"
            )
        for unit in self.extra_after:
            if not re.fullmatch(r"[A-Za-z0-9:_.@\\-]+\.[a-z]+", unit):
                raise ClusterctlError(f"unit policy: {unit!r} is not a unit name")

    @property
    def start_limit_interval(self) -> int:
        """``StartLimitIntervalSec=``: given, else sized so that ``start_limit_burst`` slow starts fit."""
        if self.start_limit_interval_s:
            return self.start_limit_interval_s
        longest = self.restart_max_delay_s if self.restart_steps else self.restart_sec
        return self.start_limit_burst * (self.load_time_s + longest)


#: The first systemd with ``RestartSteps=`` and ``RestartMaxDelaySec=`` (v254, July 2023).
RESTART_STEPS_SYSTEMD = 254


def policy_for_systemd(version: int | None, base: UnitPolicy | None = None) -> UnitPolicy:
    """``base`` with a growing restart delay where the host's systemd has it (>= 254), else as is.

    An unknown version keeps ``base`` (the directives every supported systemd
    accepts, :mod:`clusterctl.deploy.units.sdversion`).
    """
    base = base or UnitPolicy()
    if version is not None and version >= RESTART_STEPS_SYSTEMD and not base.restart_steps:
        return replace(base, restart_steps=5)
    return base


#: After= units: the data network, NVIDIA's persistence daemon and fabric manager
#: (NVSwitch systems); ordering against a unit that is not installed is a no-op.
BASE_AFTER = ("network-online.target", "nvidia-persistenced.service", "nvidia-fabricmanager.service")
#: Wants= units: started with the instance.  On an NVSwitch system a GPU that is not registered
#: with the fabric manager cannot run multi-GPU work, so the instance pulls it in rather than only
#: ordering after it; where the unit is not installed, Wants= is a no-op (systemd.unit(5)).
BASE_WANTS = ("network-online.target", "nvidia-fabricmanager.service")


def nccl_ib_tc(fabric: FabricProfile) -> int:
    """NCCL_IB_TC for the fabric's RoCE DSCP: the IP traffic-class byte ``DSCP << 2 | ECT(0)``.

    mlx5 programs only ``tc >> 2`` (the DSCP) into the QP, so the ECN bits do
    not matter on the wire; 2 (ECT(0)) gives the conventional value (106 for
    DSCP 26, lshca's expected ``Global tclass``).  ../shared/research/roce.md 3.4, 4.4.
    """
    return (fabric.roce_dscp << 2) | 2


def instance_env(inv: Inventory, inst: Instance, host: Host, gpu_uuids: Sequence[str] | None = None) -> dict[str, str]:
    """The computed, non-secret environment of an instance (before inventory ``env:``).

    ``CUDA_VISIBLE_DEVICES`` lists the placement's GPU UUIDs (``GPU-...``, as
    recorded at placement) when known, else its GPU indexes, with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so CUDA numbers GPUs as NVML (and the
    inventory) does.  With a data NIC: ``NCCL_SOCKET_IFNAME`` (its netdev),
    ``VLLM_HOST_IP`` (its address, when given), ``NCCL_IB_HCA`` (its RDMA
    devices as ``=dev:port``, exact names) and, on RoCE, ``NCCL_IB_TC``.
    """
    gpus = [g for g in inst.placement if not g.is_cpu]
    # An instance on a host's CPU slot (engine device: cpu) has no GPUs to list.
    env = (
        {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": ",".join(gpu_uuids) if gpu_uuids else ",".join(str(g.index) for g in gpus),
        }
        if gpus
        else {}
    )
    data = host.nics_with_role("data")
    if data:
        env["NCCL_SOCKET_IFNAME"] = data[0].netdev
        if data[0].address:
            env["VLLM_HOST_IP"] = data[0].address
        hcas = [f"{n.rdma_device}:{n.port}" for n in data if n.rdma_device]
        if hcas and inv.fabric.kind in ("roce", "ib"):
            env["NCCL_IB_HCA"] = "=" + ",".join(hcas)
            if inv.fabric.kind == "roce":
                env["NCCL_IB_TC"] = str(nccl_ib_tc(inv.fabric))
    return env


def cpu_engine_args(args: Mapping[str, Any], where: str, engine: str) -> list[str]:
    """What a CPU engine (vLLM's CPU build) needs beyond ``args``.

    Without an explicit KV size vLLM reserves ``--gpu-memory-utilization`` (0.92) of the
    host's RAM and refuses to start on a host that runs anything else, so
    ``kv-cache-memory-bytes`` is required (an error naming the instance); ``--enforce-eager``
    is added unless ``args`` decides (torch.compile doubles the start time on CPU)."""
    if args.get("kv-cache-memory-bytes") is None:
        raise ClusterctlError(
            f"{where}.args: engine {engine} runs on CPU: set kv-cache-memory-bytes "
            "(e.g. 1G); without it vLLM reserves 0.92 of the host's RAM and refuses to start"
        )
    return [] if "enforce-eager" in args else ["--enforce-eager"]


def vllm_args(args: Mapping[str, Any], where: str) -> list[str]:
    """``inst.args`` as vLLM flags: ``True`` -> ``--f``, ``False`` -> ``--no-f`` (or nothing
    for :data:`PLAIN_SWITCHES`), ``None`` or ``[]`` -> nothing, a list -> ``--f a b``
    (repeated ``--f a --f b`` for :data:`APPEND_FLAGS`), anything else -> ``--f str(v)``.
    Raises :class:`ClusterctlError` for a malformed flag or a secret flag."""
    out: list[str] = []
    for flag, value in args.items():
        if not _FLAG.match(flag):
            raise ClusterctlError(f"{where}.args: {flag!r} is not a vLLM flag name")
        if flag in SECRET_FLAGS:
            raise ClusterctlError(
                f"{where}.args: {flag!r} would put a secret on the command line (ps, vLLM's "
                "log); use secrets: {VLLM_API_KEY: {env: ...}} instead"
            )
        if value is None:
            continue
        if isinstance(value, bool):
            if value:
                out.append(f"--{flag}")
            elif flag not in PLAIN_SWITCHES:
                out.append(f"--no-{flag}")
        elif isinstance(value, (list, tuple)):
            items = [_scalar(v) for v in value]
            if flag in APPEND_FLAGS:
                for item in items:
                    out += [f"--{flag}", item]
            elif items:
                out += [f"--{flag}", *items]
        else:
            out += [f"--{flag}", _scalar(value)]
    return out


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def x_value(text: str) -> str:
    """A value for the ``[X-Clusterctl]`` section: one line, backslashes doubled.

    systemd (and :func:`clusterctl.deploy.units.sdversion.unit_directives`) join a line
    ending in a single backslash with the next one: a model path ending in ``\\``
    would swallow the next key.  :func:`x_clusterctl` and the node program undo it.
    """
    return _one_line(text).replace("\\", "\\\\")


def render_instance(
    inv: Inventory,
    inst: Instance,
    *,
    secrets: Mapping[str, str],
    policy: UnitPolicy | None = None,
    gpu_uuids: Sequence[str] | None = None,
) -> spec.RenderedInstance:
    """The unit and EnvironmentFile of ``inst`` (no I/O; the same input gives the same text).

    ``secrets`` is :func:`clusterctl.deploy.units.secrets.resolve_secrets`'s result
    and must hold every secret the instance refers to.  Inventory ``env:``
    values whose names look secret go to the EnvironmentFile with them and
    are listed in ``secret_keys``; other ``env:`` values (which override the
    computed ones) are ``Environment=`` lines.  ``gpu_uuids`` (the placement's
    GPUs in order, ``GPU-...``) pins the GPUs by UUID: ``CUDA_VISIBLE_DEVICES``
    names them, ``[X-Clusterctl] GPUUUIDs`` records them and a second
    ``ExecStartPre`` (``check-gpus``) refuses to start when one is not present.
    Raises :class:`ClusterctlError`
    (naming the instance) for an undefined engine or model, a placement over
    several hosts, a relative engine path, a secret flag in ``args`` or a
    missing secret.
    """
    policy = policy or UnitPolicy()
    where = f"instances.{inst.name}"
    engine = inv.engines.get(inst.engine)
    model = inv.models.get(inst.model)
    if engine is None or model is None:
        what = f"engine {inst.engine!r}" if engine is None else f"model {inst.model!r}"
        raise ClusterctlError(f"{where}: {what} is not defined in the inventory")
    if len(inst.hosts) != 1:
        raise ClusterctlError(
            f"{where}: placement spans {len(inst.hosts)} hosts ({', '.join(inst.hosts)}); an instance runs on one host"
        )
    host = inv.hosts[inst.hosts[0]]
    if not engine.path.startswith("/"):
        raise ClusterctlError(f"engines.{engine.name}.path: {engine.path!r} must be an absolute path")
    missing = sorted(set(secret_refs(inv, inst)) - set(secrets))
    if missing:
        raise ClusterctlError(f"{where}: secret(s) {', '.join(missing)} not resolved (call resolve_secrets first)")

    served = model.served_name or model.name
    argv = [engine.path, "serve", model.path]
    if "served-model-name" not in inst.args:
        argv += ["--served-model-name", served]
    if "host" not in inst.args:
        argv += ["--host", policy.bind_host]
    argv += ["--port", str(inst.port), "--tensor-parallel-size", str(inst.tp_size)]
    argv += vllm_args(inst.args, where)
    from clusterctl.deploy.units import pd  # pd builds on this module (nccl_ib_tc)

    argv += pd.kv_args(inv, inst)
    if engine.device == "cpu":
        argv += cpu_engine_args(inst.args, where, engine.name)

    if gpu_uuids is not None and (len(gpu_uuids) != len(inst.placement) or not all(_UUID.match(u) for u in gpu_uuids)):
        raise ClusterctlError(
            f"{where}: GPU UUIDs {list(gpu_uuids)} do not match its {len(inst.placement)} placed GPU(s)"
        )
    plain = instance_env(inv, inst, host, gpu_uuids)
    plain.update(pd.kv_env(inv, inst, host))
    if engine.device == "cpu":
        # vLLM 0.32's sampler torch.compiles its logprobs ranking even with --enforce-eager; on a node
        # without a C++ compiler the first logprobs request kills the engine (measured in the lab).
        plain["TORCH_COMPILE_DISABLE"] = "1"
    secret_env = dict(secrets)
    for key, value in inst.env.items():
        if not _ENV_NAME.match(key):
            raise ClusterctlError(f"{where}.env: {key!r} is not an environment variable name")
        if key == "CUDA_VISIBLE_DEVICES":
            raise ClusterctlError(f"{where}.env: CUDA_VISIBLE_DEVICES is set from the placement; remove it")
        if looks_secret(key) or key in secret_env:
            secret_env[key] = value
        else:
            plain[key] = value

    gpus = tuple(g.index for g in inst.placement if not g.is_cpu)
    gpus_csv = ",".join(str(g) for g in gpus)
    x_section = [
        ("Instance", inst.name),
        ("Host", host.name),
        ("Model", model.name),
        ("ModelPath", model.path),
        ("ModelVersion", model.version or ""),
        ("Engine", engine.name),
        ("EngineVersion", engine.version),
        ("GPUs", gpus_csv),
        ("Port", str(inst.port)),
        ("TP", str(inst.tp_size)),
    ]
    if gpu_uuids:
        x_section.append(("GPUUUIDs", ",".join(gpu_uuids)))
    where_on = f"GPU {gpus_csv}" if gpus else "CPU"
    description = _one_line(f"vLLM {inst.name}: {served} on {host.name} {where_on} port {inst.port}")
    unit_text = _template().render(
        instance=inst.name,
        description=description.replace("%", "%%"),
        after=[*BASE_AFTER, *policy.extra_after],
        wants=BASE_WANTS,
        policy=policy,
        env_path=spec.env_path(inst.name),
        environment=[environment_line(k, v) for k, v in plain.items()],
        pre_lines=[command_line([VERIFY_MODEL_PATH, model.path])]
        + ([command_line([CHECK_GPUS_PATH, *gpu_uuids])] if gpu_uuids else []),
        exec_start=command_line(argv),
        syslog_id=f"vllm-{inst.name}",
        x_section=[(k, x_value(v)) for k, v in x_section],
    )
    header = f"# clusterctl: environment of instance {inst.name} (mode 0600, root; read by systemd)\n"
    env_text = header + "".join(env_file_line(k, v) + "\n" for k, v in secret_env.items())
    return spec.RenderedInstance(
        instance=inst.name,
        host=host.name,
        unit_text=unit_text,
        env_text=env_text,
        port=inst.port,
        gpus=gpus,
        model=model.name,
        model_path=model.path,
        model_version=model.version,
        engine=engine.name,
        engine_version=engine.version,
        secret_keys=frozenset(secret_env),
        enable_at_boot=policy.enable_at_boot,
    )


_ENV: Environment | None = None


def _template() -> Any:
    global _ENV
    if _ENV is None:
        _ENV = Environment(
            loader=PackageLoader("clusterctl", "templates"),
            autoescape=False,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
            undefined=StrictUndefined,
        )
    return _ENV.get_template(TEMPLATE)


def x_clusterctl(unit_text: str) -> dict[str, str]:
    """The ``[X-Clusterctl]`` section of a unit as written by :func:`render_instance`."""
    from clusterctl.deploy.units.sdversion import unit_directives  # start-up: --help reaches this module

    return {k: v.replace("\\\\", "\\") for s, k, v in unit_directives(unit_text) if s == "X-Clusterctl"}
