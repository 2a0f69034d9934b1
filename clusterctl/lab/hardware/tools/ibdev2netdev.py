#!/usr/bin/python3
"""Fake ``ibdev2netdev`` (MLNX_OFED) for lab hosts: ``ibdev2netdev [-v]``."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import nicmodel  # noqa: E402


def main(argv):
    verbose = "-v" in argv
    unknown = [a for a in argv if a != "-v"]
    if unknown:
        sys.stderr.write("Usage: ibdev2netdev [-v] [-h]\n")
        return 1
    try:
        state = nicmodel.load()
    except (OSError, ValueError):
        return 0  # no RDMA devices: the real script prints nothing
    for ifname, nic in sorted(state.get("nics", {}).items(), key=lambda kv: kv[1]["rdma_device"]):
        up = nic.get("link_up", True)
        port = nic.get("port", 1)
        if verbose:
            sys.stdout.write(
                f"{nic.get('pci', '')} {nic['rdma_device']} ({nic.get('board', 'MT4129 - MCX75310AAS-NEAT')}) "
                f"{nic.get('description', 'NVIDIA ConnectX-7 HHHL adapter card, 400GbE / NDR IB (default mode), Single-port OSFP, PCIe 5.0 x16')} "
                f"fw {nic.get('fw', '28.39.1002')} port {port} ({'ACTIVE' if up else 'DOWN'}) ==> {ifname} ({'Up' if up else 'Down'})\n"
            )
        else:
            sys.stdout.write(f"{nic['rdma_device']} port {port} ==> {ifname} ({'Up' if up else 'Down'})\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
