#!/usr/bin/python3
"""Fake iproute2 ``dcb`` for lab hosts: ``dcb [-s] [-j] [-N] pfc|app show dev IF``,
``dcb pfc set dev IF prio-pfc all:off 3:on`` and ``dcb app add|replace|del|flush
dev IF dscp-prio 26:3 ...`` (iproute2 dcb/dcb_pfc.c, dcb_app.c, dcb.c messages).

The lab's port keeps one DSCP map of all 64 code points; DSCP entries in the
APP table mean trust dscp (as mlnx_qos decides without sysfs), so ``flush``
of ``dscp-prio`` is trust pcp and adding entries is trust dscp.

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
DSCP_NAMES = {
    0: "default",
    8: "CS1",
    10: "AF11",
    12: "AF12",
    14: "AF13",
    16: "CS2",
    18: "AF21",
    20: "AF22",
    22: "AF23",
    24: "CS3",
    26: "AF31",
    28: "AF32",
    30: "AF33",
    32: "CS4",
    34: "AF41",
    36: "AF42",
    38: "AF43",
    40: "CS5",
    46: "EF",
    48: "CS6",
    56: "CS7",
}
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
        doc = {
            "pfc_cap": 8,
            "macsec_bypass": False,
            "delay": qos.get("pfc_delay", 7),
            "prio_pfc": {str(p): bool(pfc[p]) for p in range(8)},
        }
        if stats:
            doc["requests"] = {str(p): req[p] for p in range(8)}
            doc["indications"] = {str(p): ind[p] for p in range(8)}
        sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
        return 0
    lines = [
        f"pfc-cap 8 macsec-bypass off delay {qos.get('pfc_delay', 7)} ",
        "prio-pfc " + "".join(f"{p}:{'on' if pfc[p] else 'off'} " for p in range(8)),
    ]
    if stats:
        lines.append("requests " + "".join(f"{p}:{req[p]} " for p in range(8)))
        lines.append("indications " + "".join(f"{p}:{ind[p]} " for p in range(8)))
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def app_show(ifname, nic, numeric, as_json):
    qos = nic.get("qos", {})
    pairs = []
    if qos.get("trust") == "dscp":  # trust pcp = no DSCP entries in the APP table
        d2p = qos.get("dscp2prio", [d >> 3 for d in range(64)])
        pairs = [(d, d2p[d]) for d in range(64)]
    if as_json:
        sys.stdout.write(json.dumps({"dscp_prio": [[d, p] for d, p in pairs]}, separators=(",", ":")) + "\n")
        return 0
    if pairs:
        keys = [(str(d) if numeric else DSCP_NAMES.get(d, str(d))) for d, _ in pairs]
        sys.stdout.write("dscp-prio " + "".join(f"{k}:{p} " for k, (_, p) in zip(keys, pairs)) + "\n")
    return 0


def _on_off(value):
    if value in ("on", "off"):
        return value == "on"
    raise ValueError(f'Error: argument of "PFC" must be "on" or "off", not "{value}"')


def pfc_set(ifname, args):
    """``prio-pfc MAP...`` (``all`` or 0..7 : on|off), ``delay N``; iproute2's messages."""
    pfc_changes = {}
    delay = None
    i = 0
    if not args:
        return err(PFC_SET_USAGE, 0)
    while i < len(args):
        word = args[i]
        if word == "prio-pfc":
            i += 1
            if i >= len(args):
                return err("Command line is not complete. Try option \"help\"", 255)
            while i < len(args) and ":" in args[i]:
                key, _, value = args[i].partition(":")
                try:
                    on = _on_off(value)
                    if key == "all":
                        prios = range(8)
                    else:
                        p = int(key)
                        if not 0 <= p <= 7:
                            raise ValueError("In PRIO:PFC mapping, PRIO is expected to be 0..7")
                        prios = [p]
                except ValueError as e:
                    msg = str(e) if not str(e).startswith("invalid literal") else ""
                    return err((msg + "\n" if msg else "") + f"Invalid pfc mapping {args[i]}")
                for p in prios:
                    pfc_changes[p] = 1 if on else 0
                i += 1
            continue
        if word == "delay" and i + 1 < len(args):
            try:
                delay = int(args[i + 1])
                if not 0 <= delay <= 65535:
                    raise ValueError
            except ValueError:
                return err(f"Invalid delay `{args[i + 1]}', expected an integer 0..65535")
            i += 2
            continue
        return err(f'What is "{word}"?\n' + PFC_SET_USAGE)

    def change(state, nic):
        qos = nic.setdefault("qos", {})
        pfc = list(qos.get("pfc", [0] * 8))
        for p, v in pfc_changes.items():
            pfc[p] = v
        qos["pfc"] = pfc
        qos["buffer"] = list(pfc)
        if delay is not None:
            qos["pfc_delay"] = delay

    nicmodel.update(ifname, change)
    return 0


def app_change(ifname, verb, args):
    """``dscp-prio D:P ...`` for add/replace/del, nothing more for flush."""
    if not args or args[0] != "dscp-prio":
        return err(f'What is "{args[0] if args else ""}"?\n' + APP_USAGE if args else APP_USAGE, 255 if not args else 1)
    pairs = []
    for word in args[1:]:
        key, sep, value = word.partition(":")
        try:
            if not sep:
                raise ValueError
            d, p = int(key), int(value)
        except ValueError:
            return err(f"Invalid mapping {word}")
        if not 0 <= d <= 63:
            return err("In DSCP:PRIO mapping, DSCP is expected to be 0..63\n" + f"Invalid mapping {word}")
        if not 0 <= p <= 7:
            return err("In DSCP:PRIO mapping, PRIO is expected to be 0..7\n" + f"Invalid mapping {word}")
        pairs.append((d, p))
    if verb != "flush" and not pairs:
        return err("Command line is not complete. Try option \"help\"", 255)

    def change(state, nic):
        qos = nic.setdefault("qos", {})
        d2p = qos.setdefault("dscp2prio", [d >> 3 for d in range(64)])
        if verb == "flush":
            qos["trust"] = "pcp"
            return
        for d, p in pairs:
            d2p[d] = p if verb != "del" else d >> 3
        if verb in ("add", "replace"):
            qos["trust"] = "dscp"

    nicmodel.update(ifname, change)
    return 0


PFC_SET_USAGE = (
    "Usage: dcb pfc set dev STRING\n"
    "           [ prio-pfc PFC-MAP ]\n"
    "           [ macsec-bypass { on | off } ]\n"
    "           [ delay INTEGER ]\n"
)
APP_USAGE = "Usage: dcb app { add | del | replace } dev STRING [ dscp-prio DSCP-MAP ]\n"


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
            return err("Unknown option.\nUsage: dcb [ OPTIONS ] OBJECT { COMMAND | help }")
    if not args:
        return err("Usage: dcb [ OPTIONS ] OBJECT { COMMAND | help }", 0)
    obj = args.pop(0)
    if obj not in OBJECTS:
        return err(f'Object "{obj}" is unknown')
    verbs = (
        ("show", "set") if obj == "pfc" else ("show", "add", "del", "replace", "flush") if obj == "app" else ("show",)
    )
    if not args or args[0] not in verbs:
        return err(f'What is "{args[0]}"?' if args else f"Usage: dcb {obj} show dev DEV")
    verb = args.pop(0)
    if not args or args[0] != "dev":
        return err(f"Expected `dev DEV', not `{args[0] if args else ''}'")
    if len(args) < 2:
        return err("Command line is not complete. Try option \"help\"", 255)
    ifname = args[1]
    rest = args[2:]
    try:
        state = nicmodel.load()
    except (OSError, ValueError):
        state = {}
    nic = nicmodel.nic_by_name(state, ifname)
    if nic is None:
        if not os.path.exists(f"/sys/class/net/{ifname}"):
            return err(f'Cannot find device "{ifname}"')
        return err("Attribute not supported by the device: Operation not supported", 2)
    if obj == "pfc" and verb == "set":
        return pfc_set(ifname, rest)
    if obj == "app" and verb != "show":
        return app_change(ifname, verb, rest)
    if obj == "pfc":
        return pfc_show(ifname, nic, stats, as_json)
    if obj == "app":
        return app_show(ifname, nic, numeric, as_json)
    return err(f"dcb {obj}: not modelled by the lab's simulated NIC: Operation not supported", 2)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
