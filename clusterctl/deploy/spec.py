"""Names, paths and the rendered form of an instance that every deploy part shares.

On a node, an instance ``NAME`` is:

* ``/etc/systemd/system/clusterctl-NAME.service``: the unit (mode 0644). Its
  ``[X-Clusterctl]`` section (systemd ignores ``X-`` sections) records the
  instance, model, model version, engine, engine version, GPUs and the digest,
  so what a host runs can be read back from the host alone.
* ``/etc/clusterctl/instances/NAME.env``: the ``EnvironmentFile`` (mode 0600,
  root): environment and secrets such as ``VLLM_API_KEY``. systemd (PID 1)
  reads it before dropping to the unit's ``User=``.
* ``/var/lib/clusterctl/deploy/previous/NAME.{service,env}``: what the last
  apply replaced, for rollback.
* ``/var/lib/clusterctl/deploy.lock``: the deploy lock (holder, time).

Files are always written to a temporary name in the same directory and
renamed, so neither systemd nor a reader sees half a file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

UNIT_DIR = "/etc/systemd/system"
ENV_DIR = "/etc/clusterctl/instances"
NODE_STATE_DIR = "/var/lib/clusterctl"
PREVIOUS_DIR = f"{NODE_STATE_DIR}/deploy/previous"
LOCK_PATH = f"{NODE_STATE_DIR}/deploy.lock"
UNIT_PREFIX = "clusterctl-"


def unit_name(instance: str) -> str:
    """The systemd unit an instance runs as: ``clusterctl-NAME.service``."""
    return f"{UNIT_PREFIX}{instance}.service"


def instance_of_unit(unit: str) -> str | None:
    """``clusterctl-NAME.service`` → ``NAME``; ``None`` for any other unit."""
    if unit.startswith(UNIT_PREFIX) and unit.endswith(".service"):
        return unit[len(UNIT_PREFIX) : -len(".service")] or None
    return None


def unit_path(instance: str) -> str:
    return f"{UNIT_DIR}/{unit_name(instance)}"


def env_path(instance: str) -> str:
    return f"{ENV_DIR}/{instance}.env"


def digest_of(unit_text: str, env_text: str) -> str:
    """sha256 (hex) of what is written for one instance: equal digests, nothing to do."""
    h = hashlib.sha256()
    h.update(unit_text.encode())
    h.update(b"\0")
    h.update(env_text.encode())
    return h.hexdigest()


@dataclass(frozen=True)
class RenderedInstance:
    """Everything one instance needs on its host, rendered (no I/O).

    ``env_text`` holds secrets: never print, log or put it in ``--plan``
    output; show :meth:`redacted_env` instead.  ``secret_keys`` names the
    environment variables whose values are secrets.
    """

    instance: str
    host: str
    unit_text: str
    env_text: str = field(repr=False)  # holds secrets
    port: int
    gpus: tuple[int, ...]
    model: str
    model_path: str
    model_version: str | None
    engine: str
    engine_version: str
    secret_keys: frozenset[str] = field(default_factory=frozenset)
    #: The unit has an ``[Install]`` section: apply enables it, else disables it.
    enable_at_boot: bool = True

    @property
    def unit_name(self) -> str:
        return unit_name(self.instance)

    @property
    def digest(self) -> str:
        return digest_of(self.unit_text, self.env_text)

    def redacted_env(self) -> str:
        """``env_text`` with every secret value replaced by ``***``."""
        out = []
        for line in self.env_text.splitlines():
            key, sep, _ = line.partition("=")
            out.append(f"{key}=***" if sep and key.strip() in self.secret_keys else line)
        return "\n".join(out) + ("\n" if self.env_text.endswith("\n") else "")
