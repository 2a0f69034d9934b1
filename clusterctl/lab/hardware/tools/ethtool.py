#!/usr/bin/python3
"""Fake ``ethtool`` for lab hosts: ``-S``, ``-i``, ``-a`` and plain ``ethtool IF``.

Prints the real tool's formats for the simulated ConnectX ports listed in
``nic.json``; any other interface or option gets ethtool's own error and a
non-zero exit, so callers see what an unsupported request looks like.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import nicmodel  # noqa: E402

USAGE_ERR = "ethtool: bad command line argument(s)\nFor more information run ethtool -h\n"


def stats(ifname, nic, now):
    out = ["NIC statistics:"]
    for name in nicmodel.ethtool_names(nic):
        out.append(f"     {name}: {nicmodel.value(nic, name, now)}")
    return "\n".join(out) + "\n"


def driver_info(ifname, nic):
    return (
        f"driver: mlx5_core\nversion: {nic.get('driver_version', '6.1.0-28-amd64')}\n"
        f"firmware-version: {nic.get('fw', '28.39.1002')} ({nic.get('psid', 'MT_0000000838')})\n"
        "expansion-rom-version: \n"
        f"bus-info: {nic.get('pci', '')}\n"
        "supports-statistics: yes\nsupports-test: yes\nsupports-eeprom-access: no\n"
        "supports-register-dump: no\nsupports-priv-flags: yes\n"
    )


def pause(ifname, nic):
    on = "on" if nic.get("qos", {}).get("global_pause") else "off"
    return f"Pause parameters for {ifname}:\nAutonegotiate:\toff\nRX:\t\t{on}\nTX:\t\t{on}\n"


def set_pause(args):
    """``ethtool -A IF [autoneg on|off] [rx on|off] [tx on|off]``: the port's global pause.

    The lab models one global pause flag for both directions: ``rx`` and
    ``tx`` must agree (PFC ports run with both off).
    """
    if len(args) < 3 or len(args) % 2 != 1:
        sys.stderr.write(USAGE_ERR)
        return 1
    ifname, pairs = args[0], args[1:]
    wanted = {}
    for key, value in zip(pairs[::2], pairs[1::2]):
        if key not in ("autoneg", "rx", "tx") or value not in ("on", "off"):
            sys.stderr.write(USAGE_ERR)
            return 1
        wanted[key] = value == "on"
    if wanted.get("rx", wanted.get("tx")) != wanted.get("tx", wanted.get("rx")):
        sys.stderr.write("netlink error: Operation not supported\n")
        return 75

    def change(state, nic):
        if "rx" in wanted or "tx" in wanted:
            nic.setdefault("qos", {})["global_pause"] = wanted.get("rx", wanted.get("tx"))

    try:
        nicmodel.update(ifname, change)
    except KeyError:
        sys.stderr.write("netlink error: no device matches name (offset 24)\nnetlink error: No such device\n")
        return 1
    except (OSError, ValueError):
        sys.stderr.write("netlink error: Operation not supported\n")
        return 75
    return 0


def link(ifname, nic):
    up = nic.get("link_up", True)
    speed = f"{nic.get('speed_mbps', 400000)}Mb/s" if up else "Unknown!"
    return (
        f"Settings for {ifname}:\n"
        "\tSupported ports: [ Backplane ]\n"
        "\tSupported link modes:   400000baseCR4/Full\n"
        "\tSupported pause frame use: Symmetric\n"
        "\tSupports auto-negotiation: Yes\n"
        "\tSupported FEC modes: None\t RS\n"
        "\tAdvertised link modes:  400000baseCR4/Full\n"
        "\tAdvertised pause frame use: Symmetric\n"
        "\tAdvertised auto-negotiation: Yes\n"
        "\tAdvertised FEC modes: RS\n"
        f"\tSpeed: {speed}\n"
        f"\tDuplex: {'Full' if up else 'Unknown! (255)'}\n"
        "\tAuto-negotiation: on\n"
        "\tPort: Direct Attach Copper\n"
        "\tPHYAD: 0\n"
        "\tTransceiver: internal\n"
        "\tSupports Wake-on: d\n"
        "\tWake-on: d\n"
        "\tCurrent message level: 0x00000004 (4)\n"
        "\t\t\t       link\n"
        f"\tLink detected: {'yes' if up else 'no'}\n"
    )


def main(argv):
    args = list(argv)
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write("Usage:\n        ethtool [ FLAGS ] DEVNAME\tDisplay standard information about device\n")
        return 0 if args else 1
    op = None
    if args[0].startswith("-"):
        op = args.pop(0)
    if op in ("-A", "--pause"):
        return set_pause(args)
    if len(args) != 1:
        sys.stderr.write(USAGE_ERR)
        return 1
    ifname = args[0]
    try:
        state = nicmodel.load()
    except (OSError, ValueError):
        state = {}
    nic = nicmodel.nic_by_name(state, ifname)
    real = os.path.exists(f"/sys/class/net/{ifname}")
    if nic is None:
        if not real:
            sys.stderr.write("netlink error: no device matches name (offset 24)\nnetlink error: No such device\n")
            return 1
        if op in ("-S", "--statistics"):
            sys.stderr.write("no stats available\n")
            return 94
        sys.stderr.write("Cannot get device settings: Operation not supported\n")
        return 75
    now = time.time()  # one instant for every counter of this output
    if op in ("-S", "--statistics"):
        sys.stdout.write(stats(ifname, nic, now))
    elif op in ("-i", "--driver"):
        sys.stdout.write(driver_info(ifname, nic))
    elif op in ("-a", "--show-pause"):
        sys.stdout.write(pause(ifname, nic))
    elif op is None:
        sys.stdout.write(link(ifname, nic))
    elif op in (
        "-k",
        "--show-features",
        "-g",
        "--show-ring",
        "-l",
        "--show-channels",
        "-c",
        "--show-coalesce",
        "-m",
        "--dump-module-eeprom",
        "--show-fec",
        "-T",
        "--show-time-stamping",
        "--show-priv-flags",
        "-d",
        "--register-dump",
    ):
        sys.stderr.write("netlink error: Operation not supported\n")
        return 75
    else:
        sys.stderr.write(USAGE_ERR)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
