"""Shell snippets that prepare a node for instance units; deploy's apply runs them as root.

* :func:`ensure_user_script`: the dedicated service user (``User=`` of every
  instance unit).
* :func:`verify_model_install_script`: ``verify-model``, the unit's
  ``ExecStartPre``; :func:`check_gpus_install_script`: ``check-gpus``, the
  GPU-identity ``ExecStartPre`` of units pinned by UUID.  ``clusterctl stage`` installs it too (every staging run);
  this covers nodes whose models were staged before, or by hand.

Both are idempotent, POSIX ``sh``, and print nothing on success.
"""

from __future__ import annotations

import base64
import re

from clusterctl import node
from clusterctl.errors import ClusterctlError
from clusterctl.fleet.shell import quote
from clusterctl.stage.bundle import verify_model_source
from clusterctl.stage.run import VERIFY_MODEL_PATH

_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


def user_home(user: str) -> str:
    """The service user's home: vLLM, Hugging Face and torch write caches under ``~/.cache``."""
    return f"/var/lib/{user}"


def ensure_user_script(user: str = "vllm") -> str:
    """Create system user ``user`` (own group, no login shell, home ``/var/lib/USER``) unless it exists.

    An existing user is left as it is, except that a missing home directory
    is created (owned by the user, mode 0750).  Raises
    :class:`ClusterctlError` for a name ``useradd`` would refuse.
    """
    if not _USER.match(user):
        raise ClusterctlError(f"{user!r} is not a valid user name")
    u, home = quote(user), quote(user_home(user))
    return (
        "set -e; "
        f"if ! id -u {u} >/dev/null 2>&1; then "
        "nologin=$(command -v nologin || echo /usr/sbin/nologin); "
        f"useradd --system --user-group --create-home --home-dir {home} --shell \"$nologin\" "
        f"--comment 'vLLM instances (clusterctl)' {u}; fi; "
        f"h=$(getent passwd {u} | cut -d: -f6); "
        "if [ -n \"$h\" ] && [ ! -d \"$h\" ]; then "
        f"install -d -m 0750 -o {u} -g \"$(id -g {u})\" \"$h\"; fi"
    )


#: Where deploy installs ``check-gpus`` (the units' GPU-identity ExecStartPre).
CHECK_GPUS_PATH = "/usr/local/lib/clusterctl/check-gpus"


def check_gpus_source() -> str:
    return node.source("check_gpus")


def check_gpus_install_script(path: str = CHECK_GPUS_PATH) -> str:
    """Write ``check-gpus`` (:mod:`clusterctl.node.check_gpus`) to ``path`` (0755), only if it differs."""
    return install_file_script(path, check_gpus_source())


def verify_model_install_script(path: str = VERIFY_MODEL_PATH) -> str:
    """Write ``verify-model`` to ``path`` (mode 0755) by temp file + rename, only if it differs."""
    return install_file_script(path, verify_model_source())


def install_file_script(path: str, source: str) -> str:
    """Write ``source`` to ``path`` (mode 0755) by temp file + rename, only if it differs."""
    payload = base64.b64encode(source.encode()).decode()
    p = quote(path)
    tmp = quote(f"{path}.tmp-clusterctl")
    return (
        "set -e; "
        f"mkdir -p \"$(dirname {p})\"; "
        f"printf %s {quote(payload)} | base64 -d > {tmp}; "
        f"if cmp -s {tmp} {p}; then rm -f {tmp}; "
        f"else chmod 0755 {tmp}; mv -f {tmp} {p}; fi"
    )
