"""The bytes sent to a node's ``python3``: a bootstrap, pynvml and the collector.

Built by the one builder of node programs, :func:`clusterctl.fleet.ship.build`, and run by
:func:`clusterctl.probe.run.collect_facts` through the node cache (``clusterctl.fleet.ship.run``).

The node runs ``python3 -I -B -`` (see :func:`probe_command`) with the payload
on stdin.  The payload is a small bootstrap written in syntax every Python 3
parses, so an interpreter older than 3.8 exits with :data:`RC_PYTHON_TOO_OLD`
and a message instead of a syntax error.  It then:

* defines ``CARRIED_PYNVML()``, which builds the module ``pynvml`` from the
  source of the nvidia-ml-py installed here (zlib + base64, executed into a
  ``types.ModuleType``: nothing is written on the node).  The collector calls it
  only when the node has no pynvml new enough of its own;
* compiles and runs ``clusterctl/node/collector.py`` (also zlib + base64) as ``__main__``.

Both also travel compiled (marshalled code objects, as in a .pyc): a node whose
Python writes the same bytecode as this one (implementation and magic number,
:data:`CODE_TAG`) loads them instead of compiling; any other node compiles the
source.

The payload is built once per process and cached (:func:`payload`).
"""

from __future__ import annotations

import hashlib
import os
import shlex
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from clusterctl import node
from clusterctl.errors import ProbeError
from clusterctl.fleet import ship

#: Exit status of the payload when the node's python3 is older than 3.8.
RC_PYTHON_TOO_OLD = ship.RC_PYTHON_TOO_OLD

COLLECTOR_PATH = node.path("collector")


@dataclass(frozen=True)
class Payload:
    """What to send: ``data`` (the script for stdin) and its SHA-256 ``digest``."""

    data: bytes
    digest: str
    pynvml_version: str | None

    def __len__(self) -> int:
        return len(self.data)


#: The bytecode this Python writes (implementation, magic number as in .pyc files).
CODE_TAG = ship.CODE_TAG


def _pynvml_source() -> tuple[bytes, str | None]:
    """The source of the installed pynvml module (nvidia-ml-py) and its version."""
    try:
        import pynvml
    except ImportError as e:
        raise ProbeError(f"cannot build the probe payload: pynvml (nvidia-ml-py) is not installed: {e}")
    path = getattr(pynvml, "__file__", None)
    if not path or not path.endswith(".py"):
        raise ProbeError(f"cannot build the probe payload: pynvml has no source file ({path})")
    from importlib import metadata  # ~10 ms to import; needed only here

    try:
        version: str | None = metadata.version("nvidia-ml-py")
    except metadata.PackageNotFoundError:
        version = None
    return Path(path).read_bytes(), version


def build_payload(
    collector: bytes | None = None, pynvml_source: bytes | None = None, pynvml_version: str | None = None
) -> Payload:
    """Build a payload; by default from ``collector.py`` and the installed pynvml."""
    if collector is None:
        collector = COLLECTOR_PATH.read_bytes()
    if pynvml_source is None:
        pynvml_source, pynvml_version = _pynvml_source()
    built = ship.build("collector", collector, carried={"pynvml": (pynvml_source, pynvml_version)}, label="probe")
    return Payload(built.data, built.digest, pynvml_version)


def _cache_file(key: str) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "clusterctl" / f"probe-payload-{key}.py"


@lru_cache(maxsize=1)
def payload() -> Payload:
    """The default payload, built on first use and kept for the process.

    Building it (compressing and compiling the collector and pynvml) costs about
    0.3 s of CPU, more than a cached probe of 20 hosts, so it is also kept in
    ``$XDG_CACHE_HOME/clusterctl/`` (default ``~/.cache``), named by the sha256 of
    everything it is built from (sources, pynvml version, bytecode tag, this module and the builder's);
    a copy that cannot be read or written is rebuilt, never an error.
    """
    collector = COLLECTOR_PATH.read_bytes()
    pynvml_source, pynvml_version = _pynvml_source()
    h = hashlib.sha256()
    for part in (
        collector,
        pynvml_source,
        (pynvml_version or "").encode(),
        repr(CODE_TAG).encode(),
        Path(__file__).read_bytes(),
        Path(ship.__file__).read_bytes(),  # the bootstrap
    ):
        h.update(hashlib.sha256(part).digest())
    path = _cache_file(h.hexdigest()[:32])
    try:
        data = path.read_bytes()
        return Payload(data, hashlib.sha256(data).hexdigest(), pynvml_version)
    except OSError:
        pass
    built = build_payload(collector, pynvml_source, pynvml_version)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(built.data)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass
    return built


def probe_args(
    *,
    kernel_log_cursor: str | None = None,
    nvml_timeout: float | None = None,
    nvml_budget: float | None = None,
    cmd_timeout: float | None = None,
    kernel_log_max: int | None = None,
    counter_interval: float | None = None,
    raw_outputs: bool = False,
) -> list[str]:
    """The collector's arguments (what follows ``python3 -I -B -``)."""
    argv: list[str] = []
    if kernel_log_cursor:
        argv += ["--kernel-log-cursor", kernel_log_cursor]
    if kernel_log_max is not None:
        argv += ["--kernel-log-max", str(int(kernel_log_max))]
    if nvml_timeout is not None:
        argv += ["--nvml-timeout", repr(float(nvml_timeout))]
    if nvml_budget is not None:
        argv += ["--nvml-budget", repr(float(nvml_budget))]
    if cmd_timeout is not None:
        argv += ["--cmd-timeout", repr(float(cmd_timeout))]
    if counter_interval:
        argv += ["--counter-interval", repr(float(counter_interval))]
    if raw_outputs:
        argv += ["--raw-outputs"]
    return argv


def probe_command(*, python: str = "python3", **kwargs: Any) -> str:
    """The shell command that runs the payload read from stdin, every argument quoted
    (``kwargs``: :func:`probe_args`).

    ``-I`` ignores the node's PYTHON* variables and user site; ``-B`` writes no
    byte code, so the probe leaves nothing behind.
    """
    return " ".join(shlex.quote(a) for a in [python, "-I", "-B", "-", *probe_args(**kwargs)])
