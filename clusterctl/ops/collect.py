"""The collect workflow's second half: a gathered snapshot written as a bundle for offline triage.

The snapshot comes from doctor's :func:`clusterctl.ops.doctor.gather` (raw outputs kept); here
it gets the run's meta (the inventory's path, the host pattern) and is written with the
inventory's secret-looking values replaced by ``'***'`` (bundles are handed to other people),
under a temporary name and renamed (docs/bundles.md).  Errors are
:class:`~clusterctl.errors.ClusterctlError`; the CLI renders the :class:`Collected` result.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clusterctl.deploy.units.secrets import redact_inventory_text
from clusterctl.diagnose.bundle import Snapshot, write_bundle
from clusterctl.errors import ClusterctlError


@dataclass(frozen=True)
class CollectRequest:
    """Where the bundle goes (``output``: a directory, or a ``FILE.tar.gz``) and what it records
    of the run: the inventory file read and the hosts' pattern."""

    output: str
    inventory_path: str
    pattern: str


@dataclass(frozen=True)
class Collected:
    """The bundle written (``dest``), the hosts with facts and those without (host -> why)."""

    dest: Path
    with_facts: int
    missing: dict[str, str]


def check_output(request: CollectRequest) -> None:
    """Refuse an existing ``output`` before any host is probed."""
    if Path(request.output).exists():
        raise ClusterctlError(f"{request.output}: already exists; give a new name")


def write(request: CollectRequest, snap: Snapshot) -> Collected:
    """Write ``snap`` at ``request.output``, the inventory redacted (left out when unreadable)."""
    snap.meta.update({"inventory": request.inventory_path, "pattern": request.pattern})
    try:  # bundles are handed to other people: secret-looking values as ``show --json`` hides them
        inv_text: str | None = redact_inventory_text(Path(request.inventory_path).read_text())
    except (OSError, UnicodeDecodeError):
        inv_text = None
    try:
        dest = write_bundle(snap, request.output, inv_text)
    except OSError as e:
        raise ClusterctlError(f"{request.output}: cannot write the bundle: {e.strerror}") from e
    return Collected(dest, len(snap.facts), dict(snap.missing))
