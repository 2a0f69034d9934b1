#!/usr/bin/python3
"""Fake ``mlnx_qos`` (NVIDIA mlnx-tools) for lab hosts of the "mlnx" flavour.

``mlnx_qos -i IF`` prints the port's QoS state from ``nic.json`` in the
layout of mlnx-tools' ``pretty_print()``; changing settings is not modelled
and fails with a message instead of pretending to succeed.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import nicmodel  # noqa: E402

USAGE = "Usage: mlnx_qos -i <interface> [options]\n"


def render(qos):
    out = [f"DCBX mode: {'OS controlled' if qos.get('dcbx', 'os') == 'os' else 'Firmware controlled'}",
           f"Priority trust state: {qos.get('trust', 'pcp')}"]
    if qos.get("trust") == "dscp":
        out.append("dscp2prio mapping:")
        d2p = qos.get("dscp2prio", [d >> 3 for d in range(64)])
        for prio in range(8):
            dscps = [d for d in range(64) if d2p[d] == prio]
            if qos.get("dscp_order") == "descending":
                dscps.reverse()
            for i in range(0, len(dscps), 8):
                out.append(f"\tprio:{prio} dscp:" + "".join(f"{d:02d}," for d in dscps[i:i + 8]))
    sizes = qos.get("buffer_size", [0] * 8)
    out.append("Receive buffer size (bytes): " + ",".join(str(s) for s in sizes)
               + f",max_buffer_size={qos.get('max_buffer_size', 262016)}")
    out.append(f"Cable len: {qos.get('cable_len', 7)}")
    out.append("PFC configuration:")
    out.append("\tpriority    " + "   ".join(str(p) for p in range(8)))
    out.append("\tenabled     " + "".join(f"{v}   " for v in qos.get("pfc", [0] * 8)))
    out.append("\tbuffer      " + "".join(f"{v}   " for v in qos.get("buffer", [0] * 8)))
    prio2tc = qos.get("prio2tc", list(range(8)))
    for tc in range(8):
        out.append(f"tc: {tc} ratelimit: unlimited, tsa: vendor")
        for prio in range(8):
            if prio2tc[prio] == tc:
                out.append(f"\t priority:  {prio}")
    return "\n".join(out) + "\n"


def main(argv):
    args = list(argv)
    ifname = None
    rest = []
    while args:
        a = args.pop(0)
        if a in ("-i", "--interface") and args:
            ifname = args.pop(0)
        elif a.startswith("--interface="):
            ifname = a.split("=", 1)[1]
        elif a in ("-h", "--help"):
            sys.stdout.write(USAGE)
            return 0
        else:
            rest.append(a)
    if ifname is None:
        sys.stderr.write(USAGE + "mlnx_qos: error: Interface name is required\n")
        return 2
    try:
        state = nicmodel.load()
    except (OSError, ValueError) as e:
        sys.stderr.write(f"mlnx_qos: cannot read the NIC state: {e}\n")
        return 1
    nic = nicmodel.nic_by_name(state, ifname)
    if nic is None:
        sys.stderr.write(f"Netlink error: No such device (interface {ifname})\n")
        return 1
    if rest:
        sys.stderr.write("mlnx_qos: changing settings is not supported on this simulated NIC "
                         f"(arguments: {' '.join(rest)})\n")
        return 1
    sys.stdout.write(render(nic.get("qos", {})))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
