"""The resolved inventory: what every other part of clusterctl reads.

The loader (``clusterctl.inventory.loader``) turns YAML into these objects
after expanding host ranges and merging settings with the precedence
``defaults`` (all) < group < host.  Objects are plain dataclasses so analyzers
and renderers can be tested without YAML.

Units: memory in GiB (``memory_gib``), link speeds in Gbit/s, ports are TCP
ports.  A GPU is always named by a :class:`GpuRef` (host, index), so a
tensor-parallel group is a tuple of host:GPU pairs even while instances are
limited to one host.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

HostKeyPolicy = Literal["accept-new", "strict", "off"]
NicRole = Literal["management", "data", "storage"]
Interconnect = Literal["nvlink", "pcie"]


@dataclass(frozen=True)
class Location:
    """Where a value was defined: ``file:line`` (1-based line)."""

    file: str
    line: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass
class SSHSettings:
    """How to reach a host.  ``None`` means "not set here" while merging.

    ``become`` means: log in as ``user`` and run privileged steps with sudo.
    ``become_password`` is never stored in the inventory: it is asked once at
    run time (or read from ``CLUSTERCTL_BECOME_PASSWORD``) and never logged.
    """

    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    proxy_jump: str | None = None
    known_hosts: str | None = None
    host_key_policy: HostKeyPolicy | None = None
    become: bool | None = None
    become_method: str | None = None
    connect_timeout: float | None = None

    def merged(self, over: "SSHSettings") -> "SSHSettings":
        """Return a copy where every field set in ``over`` wins."""
        out = SSHSettings(**self.__dict__)
        for k, v in over.__dict__.items():
            if v is not None:
                setattr(out, k, v)
        return out


@dataclass
class GpuSpec:
    """The GPUs a host is expected to have."""

    count: int = 0
    model: str = ""
    memory_gib: float = 0.0
    interconnect: Interconnect = "pcie"


@dataclass
class NicSpec:
    """One NIC port a host is expected to have."""

    netdev: str
    role: NicRole = "data"
    rdma_device: str | None = None
    port: int = 1
    speed_gbps: float | None = None
    address: str | None = None


@dataclass
class FabricProfile:
    """The RoCE QoS settings every data NIC should have."""

    trust: Literal["dscp", "pcp"] = "dscp"
    pfc_priority: int = 3
    roce_dscp: int = 26
    cnp_dscp: int = 48
    mtu: int = 4200
    kind: Literal["roce", "ib", "ethernet"] = "roce"


@dataclass
class ModelArch:
    """Architecture numbers vLLM's memory arithmetic needs."""

    layers: int = 0
    hidden_size: int = 0
    attention_heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    vocab: int = 0
    params: float = 0.0
    dtype: str = "bfloat16"
    quantization: str | None = None


@dataclass
class Model:
    name: str
    path: str
    source: str | None = None
    version: str | None = None
    served_name: str | None = None
    arch: ModelArch = field(default_factory=ModelArch)
    location: Location | None = None


@dataclass
class Engine:
    """A vLLM installation on the nodes: a binary path, its version and the device it computes on
    (``gpu``, or ``cpu`` for vLLM's CPU build: host RAM holds weights and KV cache)."""

    name: str
    path: str
    version: str
    location: Location | None = None
    device: str = "gpu"


#: The index of a placement slot that is no GPU: an instance of an engine with ``device: cpu`` runs on the
#: host's CPUs and takes this slot (written ``host:cpu``), so it needs no GPU on the host.
CPU_SLOT = -1


@dataclass(frozen=True, order=True)
class GpuRef:
    """One GPU: ``host:index``; or, with index :data:`CPU_SLOT`, a CPU instance's host (``host:cpu``)."""

    host: str
    index: int

    @property
    def is_cpu(self) -> bool:
        return self.index == CPU_SLOT

    def __str__(self) -> str:
        return f"{self.host}:cpu" if self.is_cpu else f"{self.host}:{self.index}"


@dataclass(frozen=True)
class SecretRef:
    """Where a secret's value is read, on the control machine, at deploy time.

    Only the reference is stored, never the value: ``kind`` ``env`` reads the
    control machine's environment variable ``ref``; ``file`` reads the file
    ``ref`` (relative paths are relative to the inventory file's directory).
    ``clusterctl.deploy.units.secrets.resolve_secrets`` reads the values.
    """

    kind: Literal["env", "file"]
    ref: str
    location: Location | None = None


@dataclass
class Instance:
    """One vLLM server process.  ``placement`` is its TP group.

    ``secrets`` maps an environment variable (e.g. ``VLLM_API_KEY``) to where
    its value is read at deploy time; it reaches the node only in the
    instance's EnvironmentFile (mode 0600).
    """

    name: str
    model: str
    engine: str
    placement: tuple[GpuRef, ...]
    port: int
    args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    role: Literal["mixed", "prefill", "decode"] = "mixed"
    template: str | None = None
    location: Location | None = None
    secrets: dict[str, SecretRef] = field(default_factory=dict)

    @property
    def tp_size(self) -> int:
        return len(self.placement)

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(sorted({g.host for g in self.placement}))


@dataclass(frozen=True)
class AutoscalePolicy:
    """A template's autoscaling policy (docs/autoscale.md; read by ``inventory/autoscale.py``).

    ``signal``: ``load`` (the load score), ``queue`` (waiting requests per replica),
    ``kv`` (KV-cache usage) or ``ttft_p90`` (seconds); ``high``/``low``: the band;
    ``*_after_s``: how long the signal must stay outside the band before acting;
    ``cooldown_*_s``: the least time after any action before the next one of that
    direction; ``hosts``/``gpus``: where new replicas may go (within the template's
    hosts; ``None``/empty: anywhere the template may); ``worth``: GPU model -> what
    one replica on it is worth (1.0 when not listed).
    """

    min_replicas: int
    max_replicas: int
    signal: str = "load"
    high: float = 0.7
    low: float = 0.3
    window_s: float = 10.0
    scale_out_after_s: float = 30.0
    scale_in_after_s: float = 600.0
    cooldown_out_s: float = 60.0
    cooldown_in_s: float = 300.0
    max_step: int = 1
    backoff_s: float = 300.0
    interval_s: float = 15.0
    hosts: str | None = None
    gpus: tuple[GpuRef, ...] = ()
    prefer_gpu: str | None = None
    worth: tuple[tuple[str, float], ...] = ()
    gate_timeout_s: float = 600.0
    drain_timeout_s: float = 900.0
    location: Location | None = None

    def worth_of(self, gpu_model: str) -> float:
        return dict(self.worth).get(gpu_model, 1.0)


@dataclass
class InstanceTemplate:
    """``replicas`` instances of ``tp`` GPUs each, placed over ``hosts``.

    ``nodes`` > 1: each replica spans that many hosts, one pipeline stage of ``tp`` GPUs on each
    (docs/multinode.md); ``tp`` is then the tensor-parallel size within a host."""

    name: str
    model: str
    engine: str
    replicas: int
    tp: int
    hosts: str
    port_base: int = 8000
    nodes: int = 1
    args: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    role: Literal["mixed", "prefill", "decode"] = "mixed"
    location: Location | None = None
    secrets: dict[str, SecretRef] = field(default_factory=dict)
    autoscale: AutoscalePolicy | None = None


@dataclass
class Host:
    """One server, with every setting already merged (all < group < host)."""

    name: str
    address: str
    groups: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    vars: dict[str, Any] = field(default_factory=dict)
    ssh: SSHSettings = field(default_factory=SSHSettings)
    gpus: GpuSpec = field(default_factory=GpuSpec)
    nics: list[NicSpec] = field(default_factory=list)
    location: Location | None = None

    def nics_with_role(self, role: NicRole) -> list[NicSpec]:
        return [n for n in self.nics if n.role == role]


@dataclass
class GrayRelease:
    """Clients asking for ``served`` go to ``canary`` (an inventory model) for
    ``percent`` % of sessions (requests without a session: of requests), else
    to ``stable``."""

    served: str
    stable: str
    canary: str
    percent: float
    location: Location | None = None


@dataclass
class Mirror:
    """``percent`` % of live requests for ``served`` are copied to the
    instances of ``candidate`` (an inventory model); their answers are discarded."""

    served: str
    candidate: str
    percent: float
    location: Location | None = None


@dataclass
class VipSpec:
    """A floating address the gateway hosts share with keepalived (VRRP, docs/gateway.md).

    ``address`` with ``prefix`` is added on ``interface`` of the host that is
    MASTER; the peers are the other gateway hosts' inventory addresses (unicast
    VRRP).  ``password`` is where VRRP's PASS authentication (8 characters at
    most) is read, never the value.
    """

    address: str
    prefix: int
    interface: str
    router_id: int = 51
    password: SecretRef | None = None
    advert_s: int = 1
    location: Location | None = None


@dataclass
class GatewaySpec:
    """The nginx gateway in front of the instances (docs/gateway.md).

    ``max_conns`` is per instance (upstream server); ``max_connections`` and
    ``requests_per_second`` (+ ``burst``) are per client address, 0 = no limit;
    ``sync_interval_s`` is the least time between two reloads by ``gateway sync``.
    ``api_key`` is where the key the instances require is read (never the value).
    """

    hosts: tuple[str, ...]
    port: int = 8080
    session_header: str = "X-Session-ID"
    max_conns: int = 0
    max_connections: int = 0
    requests_per_second: float = 0.0
    burst: int = 0
    sync_interval_s: float = 10.0
    read_timeout_s: int = 3600
    api_key: SecretRef | None = None
    gray: list[GrayRelease] = field(default_factory=list)
    mirrors: list[Mirror] = field(default_factory=list)
    location: Location | None = None
    #: ``keys``: every request needs a client key (``gateway key add``); ``none``: an open gateway.
    auth: str = "keys"
    #: ``(address, port)`` pairs nginx listens on; address ``""`` = every address.
    listen: tuple[tuple[str, int], ...] = ()
    #: PEM certificate (a path on the control machine) and its key; both or neither.
    tls_certificate: SecretRef | None = None
    tls_key: SecretRef | None = None
    #: The loopback-only admin server (health, scores) on every gateway host.
    admin_port: int = 18080
    #: Per client key: requests per second (+ burst) and concurrent streams; 0 = no limit.
    key_requests_per_second: float = 0.0
    key_burst: int = 0
    key_streams: int = 0
    #: ``least_score`` (default): njs picks the instance per request from the requests in flight
    #: and the scores pushed by ``gateway sync`` (no reload; docs/gateway.md has the benchmark);
    #: ``least_conn``: nginx's least_conn with weights (a reload per weight change).
    dispatch: str = "least_score"
    #: The floating address of two or more gateway hosts (keepalived); ``None``: none.
    vip: VipSpec | None = None

    def listen_addresses(self) -> tuple[tuple[str, int], ...]:
        return self.listen or (("", self.port),)


#: KV connectors clusterctl renders (vLLM 0.32's registry has these names), and the ``kv_role`` of
#: each side: NIXL and Mooncake pair two ``kv_both`` instances (vLLM's NixlConnector usage guide);
#: P2pNcclConnector a ``kv_producer`` with a ``kv_consumer`` (vLLM's disagg_prefill docs).
CONNECTOR_ROLES = {
    "NixlConnector": ("kv_both", "kv_both"),
    "MooncakeConnector": ("kv_both", "kv_both"),
    "P2pNcclConnector": ("kv_producer", "kv_consumer"),
}


#: A pool router's default Prometheus port: its HTTP port plus this (vllm-router's own default, 29000 on
#: 127.0.0.1, would collide between two routers of one host and cannot be scraped from elsewhere).
ROUTER_METRICS_OFFSET = 10000


@dataclass
class PdRouter:
    host: str
    port: int = 8300
    policy: str = "round_robin"
    #: vllm-router's Prometheus port (``--prometheus-port``); None: ``port`` + ROUTER_METRICS_OFFSET
    metrics_port: int | None = None

    @property
    def prometheus_port(self) -> int:
        return self.metrics_port if self.metrics_port is not None else self.port + ROUTER_METRICS_OFFSET


@dataclass
class PdPool:
    name: str
    model: str
    router: PdRouter
    connector: str = "NixlConnector"
    location: Location | None = None
    prefill: list[str] = field(default_factory=list)  # instance or template names
    decode: list[str] = field(default_factory=list)

    @property
    def router_name(self) -> str:
        """Its router's instance name: ``router-NAME`` (the unit ``clusterctl-router-NAME.service``)."""
        return f"router-{self.name}"

    def kv_role(self, role: str) -> str:
        producer, consumer = CONNECTOR_ROLES[self.connector]
        return producer if role == "prefill" else consumer


@dataclass
class Inventory:
    """The whole resolved inventory.

    ``hosts`` keeps the file's order; ``groups`` maps a group name to its
    member host names (``all`` is implicit and not stored).
    """

    path: str
    hosts: dict[str, Host] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)
    #: ``cluster:``, the name its state is kept under; "" when absent (clusterctl.clusterstate.cluster_name)
    cluster: str = ""
    models: dict[str, Model] = field(default_factory=dict)
    engines: dict[str, Engine] = field(default_factory=dict)
    instances: dict[str, Instance] = field(default_factory=dict)
    templates: dict[str, InstanceTemplate] = field(default_factory=dict)
    fabric: FabricProfile = field(default_factory=FabricProfile)
    gateway: GatewaySpec | None = None
    pd_pools: dict[str, PdPool] = field(default_factory=dict)  # prefill/decode pools (pdpools.py)
    warnings: list[str] = field(default_factory=list)
