#!/usr/bin/python3
"""Fake iproute2 ``rdma`` for lab hosts: ``statistic show``, ``link show``, ``dev show``.

Object and command names accept unique prefixes as the real tool does
(``rdma stat show``); ``-j`` prints JSON arrays.
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import nicmodel  # noqa: E402

OBJECTS = ("dev", "link", "resource", "statistic", "system")


def matches(word, full):
    return bool(word) and full.startswith(word)


def err(msg, rc=1):
    sys.stderr.write(msg + "\n")
    return rc


def ports(state, selector):
    """(ifname, nic) pairs in RDMA-device order, filtered by DEV or DEV/PORT."""
    rows = sorted(state.get("nics", {}).items(), key=lambda kv: kv[1]["rdma_device"])
    if selector is None:
        return rows
    dev, _, port = selector.partition("/")
    out = [(i, n) for i, n in rows if n["rdma_device"] == dev and (not port or str(n.get("port", 1)) == port)]
    return out


def stat_show(state, selector, as_json):
    rows = ports(state, selector)
    if selector and not rows:
        return err("Wrong device name")
    docs, text = [], []
    now = time.time()  # one instant for the whole output
    for _, nic in rows:
        names = nicmodel.hw_counter_names(nic)
        if as_json:
            doc = {"ifname": nic["rdma_device"], "port": nic.get("port", 1)}
            doc.update({n: nicmodel.value(nic, n, now) for n in names})
            docs.append(doc)
        else:
            text.append(
                f"link {nic['rdma_device']}/{nic.get('port', 1)} "
                + "".join(f"\n    {n} {nicmodel.value(nic, n, now)} " for n in names)
                + "\n"
            )
    sys.stdout.write(json.dumps(docs, separators=(",", ":")) + "\n" if as_json else "".join(text))
    return 0


def link_show(state, selector, as_json):
    rows = ports(state, selector)
    if selector and not rows:
        return err("Wrong device name")
    docs, text = [], []
    for idx, (ifname, nic) in enumerate(rows):
        up = nic.get("link_up", True)
        st, phys = ("ACTIVE", "LINK_UP") if up else ("DOWN", "DISABLED")
        if as_json:
            docs.append(
                {
                    "ifindex": idx,
                    "ifname": nic["rdma_device"],
                    "port": nic.get("port", 1),
                    "state": st,
                    "physical_state": phys,
                    "netdev": ifname,
                }
            )
        else:
            text.append(
                f"link {nic['rdma_device']}/{nic.get('port', 1)} state {st} physical_state {phys} netdev {ifname} \n"
            )
    sys.stdout.write(json.dumps(docs, separators=(",", ":")) + "\n" if as_json else "".join(text))
    return 0


def dev_show(state, selector, as_json):
    rows = ports(state, selector)
    docs, text = [], []
    for idx, (_, nic) in enumerate(rows):
        guid = nic.get("node_guid", "0c42:a103:0000:0000")
        if as_json:
            docs.append(
                {
                    "ifindex": idx,
                    "ifname": nic["rdma_device"],
                    "node_type": "ca",
                    "fw": nic.get("fw", "28.39.1002"),
                    "node_guid": guid,
                    "sys_image_guid": guid,
                }
            )
        else:
            text.append(
                f"{idx}: {nic['rdma_device']}: node_type ca fw {nic.get('fw', '28.39.1002')} "
                f"node_guid {guid} sys_image_guid {guid} \n"
            )
    sys.stdout.write(json.dumps(docs, separators=(",", ":")) + "\n" if as_json else "".join(text))
    return 0


def main(argv):
    args = list(argv)
    as_json = False
    while args and args[0].startswith("-"):
        a = args.pop(0)
        if a in ("-j", "-json", "--json"):
            as_json = True
        elif a in ("-d", "-details", "-p", "-pretty"):
            pass
        else:
            return err(f'Option "{a}" is unknown, try "rdma -help".')
    if not args:
        return err("Usage: rdma [ OPTIONS ] OBJECT { COMMAND | help }")
    word = args.pop(0)
    obj = next((o for o in OBJECTS if matches(word, o)), None)
    if obj is None:
        return err(f'Object "{word}" is unknown, try "rdma help".')
    cmd = args.pop(0) if args else "show"
    if not (matches(cmd, "show") or matches(cmd, "list")):
        return err(f"rdma {obj} {cmd}: not modelled by the lab's simulated NIC: Operation not supported")
    selector = None
    if obj == "statistic" and args and matches(args[0], "link"):
        args.pop(0)
    if args:
        selector = args.pop(0)
    try:
        state = nicmodel.load()
    except (OSError, ValueError):
        state = {}
    if obj == "statistic":
        return stat_show(state, selector, as_json)
    if obj == "link":
        return link_show(state, selector, as_json)
    if obj == "dev":
        return dev_show(state, selector, as_json)
    return err(f"rdma {obj}: not modelled by the lab's simulated NIC: Operation not supported")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
