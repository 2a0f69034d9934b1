#!/usr/bin/python3
"""Fake iproute2 ``dcb`` for lab hosts: ``dcb [-s] [-j] [-N] pfc|app show dev IF``.

The PFC request/indication statistics are the per-priority ``tx_prioN_pause``
and ``rx_prioN_pause`` counters, as the mlx5 driver reports them through dcbnl.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import nicmodel  # noqa: E402

#: iproute2 etc/iproute2/rt_dsfield names, keyed by DSCP (the file lists TOS bytes).
DSCP_NAMES = {0: "default", 8: "CS1", 10: "AF11", 12: "AF12", 14: "AF13", 16: "CS2", 18: "AF21",
              20: "AF22", 22: "AF23", 24: "CS3", 26: "AF31", 28: "AF32", 30: "AF33", 32: "CS4",
              34: "AF41", 36: "AF42", 38: "AF43", 40: "CS5", 46: "EF", 48: "CS6", 56: "CS7"}
OBJECTS = ("app", "apptrust", "buffer", "dcbx", "ets", "maxrate", "pfc", "rewr")


def err(msg, rc=1):
    sys.stderr.write(msg + "\n")
    return rc


def pfc_show(ifname, nic, stats, as_json):
    qos = nic.get("qos", {})
    pfc = qos.get("pfc", [0] * 8)
    now = time.time()
    req = [nicmodel.value(nic, f"tx_prio{p}_pause", now) for p in range(8)]
    ind = [nicmodel.value(nic, f"rx_prio{p}_pause", now) for p in range(8)]
    if as_json:
        doc = {"pfc_cap": 8, "macsec_bypass": False, "delay": qos.get("pfc_delay", 7),
               "prio_pfc": {str(p): bool(pfc[p]) for p in range(8)}}
        if stats:
            doc["requests"] = {str(p): req[p] for p in range(8)}
            doc["indications"] = {str(p): ind[p] for p in range(8)}
        sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
        return 0
    lines = [f"pfc-cap 8 macsec-bypass off delay {qos.get('pfc_delay', 7)} ",
             "prio-pfc " + "".join(f"{p}:{'on' if pfc[p] else 'off'} " for p in range(8))]
    if stats:
        lines.append("requests " + "".join(f"{p}:{req[p]} " for p in range(8)))
        lines.append("indications " + "".join(f"{p}:{ind[p]} " for p in range(8)))
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def app_show(ifname, nic, numeric, as_json):
    qos = nic.get("qos", {})
    pairs = []
    if qos.get("trust") == "dscp":   # trust pcp = no DSCP entries in the APP table
        d2p = qos.get("dscp2prio", [d >> 3 for d in range(64)])
        pairs = [(d, d2p[d]) for d in range(64)]
    if as_json:
        sys.stdout.write(json.dumps({"dscp_prio": [[d, p] for d, p in pairs]},
                                    separators=(",", ":")) + "\n")
        return 0
    if pairs:
        keys = [(str(d) if numeric else DSCP_NAMES.get(d, str(d))) for d, _ in pairs]
        sys.stdout.write("dscp-prio " + "".join(f"{k}:{p} " for k, (_, p) in zip(keys, pairs)) + "\n")
    return 0


def main(argv):
    args = list(argv)
    stats = as_json = numeric = False
    while args and args[0].startswith("-"):
        a = args.pop(0)
        if a in ("-s", "--statistics"):
            stats = True
        elif a in ("-j", "--json"):
            as_json = True
        elif a in ("-N", "--Numeric"):
            numeric = True
        elif a in ("-p", "--pretty"):
            pass
        else:
            return err(f'Option "{a}" is unknown, try "dcb help".')
    if not args:
        return err("Usage: dcb [ OPTIONS ] OBJECT { COMMAND | help }")
    obj = args.pop(0)
    if obj not in OBJECTS:
        return err(f'Object "{obj}" is unknown, try "dcb help".')
    if not args or args[0] != "show" or len(args) < 3 or args[1] != "dev":
        return err(f"Usage: dcb {obj} show dev DEV")
    ifname = args[2]
    try:
        state = nicmodel.load()
    except (OSError, ValueError):
        state = {}
    nic = nicmodel.nic_by_name(state, ifname)
    if nic is None:
        if not os.path.exists(f"/sys/class/net/{ifname}"):
            return err(f'Cannot find device "{ifname}"')
        return err("Attribute not supported by the device: Operation not supported", 2)
    if obj == "pfc":
        return pfc_show(ifname, nic, stats, as_json)
    if obj == "app":
        return app_show(ifname, nic, numeric, as_json)
    return err(f"dcb {obj}: not modelled by the lab's simulated NIC: Operation not supported", 2)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
