"""SSH fan-out: run commands on many hosts with bounded concurrency.

Public API: :class:`Fleet`, :class:`RunResults`, :class:`HostResult`,
:class:`HostStatus`; transports in :mod:`clusterctl.fleet.transport`
(protocol and fake) and :mod:`clusterctl.fleet.ssh` (paramiko).
"""

from clusterctl.fleet.fleet import Fleet
from clusterctl.fleet.results import Group, HostResult, HostStatus, RunResults

__all__ = ["Fleet", "Group", "HostResult", "HostStatus", "RunResults"]
