"""The single exception tree of clusterctl.

Every error the core raises on purpose derives from :class:`ClusterctlError`,
so the CLI can turn any of them into a clear message and an exit code without
a traceback.  Per-host failures during fan-out are *not* raised: they become
result rows (see ``clusterctl.fleet.results``).
"""

from __future__ import annotations

from dataclasses import dataclass


class ClusterctlError(Exception):
    """Base class of every error clusterctl raises deliberately."""


@dataclass(frozen=True)
class Problem:
    """One problem found while reading a file, located as ``file:line``.

    ``line`` is 1-based; 0 means "the file as a whole".  ``severity`` is
    ``"error"`` or ``"warning"`` (warnings are accepted with ``--force``).
    """

    file: str
    line: int
    message: str
    severity: str = "error"

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        tag = "" if self.severity == "error" else f"{self.severity}: "
        return f"{where}: {tag}{self.message}"


class ConfigError(ClusterctlError):
    """A configuration file (inventory, user config, checks) is not usable.

    Carries every problem found, so the user sees them all at once.
    """

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]


class InventoryError(ConfigError):
    """The inventory failed validation."""


class SelectionError(ClusterctlError):
    """A host selection pattern is malformed or names unknown groups."""


class FleetError(ClusterctlError):
    """The fleet as a whole could not run (not a single host's failure)."""


class ProbeError(ClusterctlError):
    """The probe's output could not be understood."""


class LabError(ClusterctlError):
    """The local lab could not be brought up, changed or torn down."""
