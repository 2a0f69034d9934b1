"""The data NICs' network links inside a lab host's network namespace.

Each simulated ConnectX port is a standalone link with the real name, MAC and
MTU, so ``ip link``, ``/sys/devices/virtual/net`` and anything that lists
interfaces agree with the fake sysfs tree and tools.  The link type is
``ifb`` because this machine's kernel has no ``dummy`` driver (``Error:
Unknown device type.``); either carries no traffic: the counters come from
the simulation, not from packets.
"""

from __future__ import annotations

import subprocess

from clusterctl.errors import LabError
from clusterctl.lab.hardware.nics import mac_address
from clusterctl.lab.hardware.profiles import DATA_NICS

#: Seconds one ``ip`` call may take.
IP_TIMEOUT_S = 15.0


def _ip(netns: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = ["ip", "-n", netns, *args]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    except FileNotFoundError as e:
        raise LabError("ip: command not found (install iproute2)") from e
    except subprocess.TimeoutExpired as e:
        raise LabError(f"`{' '.join(argv)}` did not finish within {IP_TIMEOUT_S:.0f} s") from e


def setup_netns(netns: str, name: str, index: int) -> None:
    """Create the data links (``eth2``, ``eth3``) in ``netns``, with MAC and MTU, and set them up.

    Idempotent: an existing link of the same name is reconfigured.  Raises
    :class:`LabError` naming the failing ``ip`` command (e.g. no such netns).
    """
    for k, spec in enumerate(DATA_NICS):
        exists = _ip(netns, "link", "show", "dev", spec.netdev).returncode == 0
        # This kernel lacks CONFIG_DUMMY; an ifb link is a standalone stand-in
        # whose MAC can only be given at creation, so an existing one is recreated.
        steps: list[tuple[str, ...]] = [("link", "del", "dev", spec.netdev)] if exists else []
        steps += [
            ("link", "add", spec.netdev, "address", mac_address(index, k), "mtu", str(spec.mtu), "type", "ifb"),
            ("link", "set", "dev", spec.netdev, "up"),
        ]
        for step in steps:
            cp = _ip(netns, *step)
            if cp.returncode != 0:
                raise LabError(
                    f"{name}: `ip -n {netns} {' '.join(step)}` failed (rc {cp.returncode}): {cp.stderr.strip()}"
                )
