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

import re

from clusterctl.errors import ClusterctlError
from clusterctl.fleet import ship
from clusterctl.fleet.shell import quote
from clusterctl.stage.bundle import verify_model
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
    """``check-gpus`` as the builder of node programs makes it (deploy's read runs it with ``--list``)."""
    return ship.installed("check_gpus").text


def check_gpus_install_script(path: str = CHECK_GPUS_PATH) -> str:
    """Write ``check-gpus`` (:mod:`clusterctl.node.check_gpus`) to ``path`` (0755), only if it differs
    (:func:`clusterctl.fleet.ship.install_script`: its sha256 checked on the node)."""
    return ship.install_script(ship.installed("check_gpus"), path)


def verify_model_install_script(path: str = VERIFY_MODEL_PATH) -> str:
    """Write ``verify-model`` to ``path`` (0755) by temp file + rename, only if it differs
    (:func:`clusterctl.fleet.ship.install_script`: its sha256 checked on the node)."""
    return ship.install_script(verify_model(), path)
