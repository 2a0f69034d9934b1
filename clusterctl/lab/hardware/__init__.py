"""Simulated GPUs and ConnectX NICs for the lab hosts.

What the lab-hosts code calls:

- :func:`install_into_rootfs` once per template: builds the fake
  ``libnvidia-ml.so.1`` and installs it and the fake NIC tools.
- :func:`provision_host` per host: its state directory ``<host_dir>/hw``
  (bind it read-write at ``/var/lib/lab-hw``) and the fake ``/sys/class``
  tree ``<host_dir>/hw/sys-class`` (bind it read-only over ``/sys/class``).
- :func:`setup_netns` per host: the data links in its network namespace.
- ``python3 -m clusterctl.lab.hardware.ticker LAB_DIR``: keeps sysfs counters moving.
- :data:`faults.FAULTS`, :func:`faults.heal`: ``lab inject`` / ``lab heal``.

The formats, state files and faults are documented in ``docs/lab-hardware.md``.
"""

from __future__ import annotations

from clusterctl.lab.hardware.host import describe_host, hw_dir, install_into_rootfs, provision_host
from clusterctl.lab.hardware.netns import setup_netns

__all__ = ["install_into_rootfs", "provision_host", "setup_netns", "describe_host", "hw_dir"]
