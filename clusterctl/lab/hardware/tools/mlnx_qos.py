#!/usr/bin/python3
"""Fake ``mlnx_qos`` (NVIDIA mlnx-tools) for lab hosts of the "mlnx" flavour.

``mlnx_qos -i IF`` prints the port's QoS state from ``nic.json`` in the
layout of mlnx-tools' ``pretty_print()``.  ``--trust``, ``--pfc``,
``--dscp2prio`` and ``--cable_len`` change it (``nic.json`` and the QoS sysfs
files together, :func:`nicmodel.update`), with mlnx-tools' checks, order and
messages (python/mlnx_qos: optparse errors exit 2 on stderr; its own checks
print on stdout and exit 1; the state is printed after a change, as there).
Where MLNX_OFED's sysfs ``qos/trust`` exists (every "mlnx" lab host) a
``--dscp2prio set`` writes the map and ``del``/``flush`` do nothing, as there.
Other options (ETS, rate limits, buffers, DCBX) are refused, not faked.
"""

import optparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import nicmodel  # noqa: E402

USAGE = "Usage: mlnx_qos -i <interface> [options]\n"


def render(qos):
    out = [
        f"DCBX mode: {'OS controlled' if qos.get('dcbx', 'os') == 'os' else 'Firmware controlled'}",
        f"Priority trust state: {qos.get('trust', 'pcp')}",
    ]
    if qos.get("trust") == "dscp":
        out.append("dscp2prio mapping:")
        d2p = qos.get("dscp2prio", [d >> 3 for d in range(64)])
        for prio in range(8):
            dscps = [d for d in range(64) if d2p[d] == prio]
            if qos.get("dscp_order") == "descending":
                dscps.reverse()
            for i in range(0, len(dscps), 8):
                out.append(f"\tprio:{prio} dscp:" + "".join(f"{d:02d}," for d in dscps[i : i + 8]))
    sizes = qos.get("buffer_size", [0] * 8)
    out.append(
        "Receive buffer size (bytes): "
        + ",".join(str(s) for s in sizes)
        + f",max_buffer_size={qos.get('max_buffer_size', 262016)}"
    )
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


class _Parser(optparse.OptionParser):
    def error(self, msg):  # optparse's own: usage + "prog: error: msg" on stderr, exit 2
        sys.stderr.write(USAGE + f"\nmlnx_qos: error: {msg}\n")
        sys.exit(2)


def _parser():
    p = _Parser(usage="%prog -i <interface> [options]", prog="mlnx_qos", add_help_option=False)
    p.add_option("-h", "--help", action="store_true", dest="help")
    p.add_option("-i", "--interface", dest="intf")
    p.add_option("-f", "--pfc", dest="pfc")
    p.add_option("--trust", dest="trust")
    p.add_option("--dscp2prio", dest="dscp2prio", action="append")
    p.add_option("--cable_len", dest="cable_len")
    for short, long in (
        ("-p", "--prio_tc"),
        ("-s", "--tsa"),
        ("-t", "--tcbw"),
        ("-r", "--ratelimit"),
        ("-d", "--dcbx"),
    ):
        p.add_option(short, long, dest="unsupported_" + long.strip("-"))
    for long in ("--defltprio", "--prio2buffer", "--buffer_size"):
        p.add_option(long, dest="unsupported_" + long.strip("-"))
    p.add_option("-a", action="store_true", dest="printall")
    return p


def _fail(msg, usage=False):
    sys.stdout.write(msg + "\n" + (USAGE if usage else ""))
    return 1


def _int(text, lo, hi, what):
    try:
        v = int(text)
        if v < lo or v > hi:
            raise ValueError(f"{v} is not in the range {lo}..{hi}")
        return v
    except ValueError as e:
        raise _BadValue(f"Bad value for {what}: {e}")


class _BadValue(Exception):
    pass


def _settings(o):
    """The changes asked for, checked in mlnx_qos' order; raises _BadValue with its message."""
    todo = []
    delay = _int(o.cable_len, 0, 0xFFFF, "cable_len") if o.cable_len else 0
    if o.pfc:
        bits = []
        for t in o.pfc.split(","):
            if len(bits) >= 8:
                raise _BadValue(
                    "Too many items for PFC",
                )
            bits.append(_int(t, 0, 1, "PFC"))
        if len(bits) != 8:
            raise _BadValue("pfc list must have 8 items")
        todo.append(("pfc", bits))
    if delay:
        todo.append(("cable_len", delay))
    if o.dscp2prio and o.trust:
        raise _BadValue("trust and dscp2prio commands cannot be used at the same time.")
    for opt in o.dscp2prio or []:
        if opt == "flush":
            todo.append(("dscp2prio", ("flush", None, None)))
            continue
        try:
            action, dscp, prio = opt.split(",")
            dscp, prio = int(dscp), int(prio)
            if action not in ("set", "del") or dscp > 63 or prio > 7 or dscp < 0 or prio < 0:
                raise ValueError
        except ValueError:
            raise _BadValue("Invalid dscp2prio command. Refer to the help.")
        todo.append(("dscp2prio", (action, dscp, prio)))
    if o.trust:
        if o.trust not in ("dscp", "pcp"):
            raise _BadValue("Invalid trust state command. Refer to the help.")
        todo.append(("trust", o.trust))
    return todo


def _apply(todo):
    def change(state, nic):
        qos = nic.setdefault("qos", {})
        for what, value in todo:
            if what == "pfc":
                qos["pfc"] = list(value)
                qos["buffer"] = list(value)  # the lab's ports keep each PFC priority in its own buffer
            elif what == "cable_len":
                qos["cable_len"] = value
            elif what == "trust":
                qos["trust"] = value
            elif what == "dscp2prio" and value[0] == "set":
                d2p = qos.setdefault("dscp2prio", [d >> 3 for d in range(64)])
                d2p[value[1]] = value[2]

    return change


def main(argv):
    parser = _parser()
    o, args = parser.parse_args(list(argv))
    if o.help:
        sys.stdout.write(USAGE)
        return 0
    if args:
        return _fail("Bad arguments", usage=True)
    if o.intf is None:
        return _fail("Interface name is required", usage=True)
    ifname = o.intf
    try:
        state = nicmodel.load()
    except (OSError, ValueError) as e:
        sys.stderr.write(f"mlnx_qos: cannot read the NIC state: {e}\n")
        return 1
    nic = nicmodel.nic_by_name(state, ifname)
    if nic is None:
        sys.stderr.write(f"Netlink error: No such device (interface {ifname})\n")
        return 1
    asked = [k for k, v in vars(o).items() if k.startswith("unsupported_") and v is not None]
    if asked:
        sys.stderr.write(
            "mlnx_qos: this simulated NIC does not model "
            + ", ".join(k.removeprefix("unsupported_") for k in asked)
            + "\n"
        )
        return 1
    try:
        todo = _settings(o)
    except _BadValue as e:
        return _fail(str(e), usage=str(e).startswith("Bad value"))
    if todo:
        nic = nicmodel.update(ifname, _apply(todo))
    sys.stdout.write(render(nic.get("qos", {})))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
