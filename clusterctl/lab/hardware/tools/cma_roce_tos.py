#!/usr/bin/python3
"""Fake ``cma_roce_tos`` (mlnx-tools ``sbin/cma_roce_tos``) for lab hosts:
``cma_roce_tos [-d DEV] [-p PORT] [-t TOS] [-h]`` sets and prints the RDMA-CM default
RoCE ToS of one port in configfs: ``/sys/kernel/config/rdma_cm/DEV/ports/PORT/default_roce_tos``
in a lab host (which has none where the machine's kernel has no configfs: a container's /sys
is read-only, so no fake can be bound there), the fake tree ``nicmodel.cm_tos_path`` in unit
tests (``LAB_HW_DIR`` set).

As the real bash script: options by getopts (an unknown option or a missing argument is
said on stderr and ignored), root only, ``Module rdma_cm is not loaded ...`` without
``rdma_cm``, ``Failed to create configuration for DEV`` for an unknown device (the
kernel refuses the mkdir), ``Device DEV port P does not exist``; a ToS that is not a
decimal number is bash's ``integer expression expected`` (nothing set), one the kernel's
``kstrtou8`` refuses (over 255) is ``write error: Invalid argument`` (nothing set); in
both cases the script goes on, prints the current value and exits 0.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import nicmodel  # noqa: E402

PROG = "cma_roce_tos"
USAGE = """Set/Show RoCE default ToS of RDMA_CM applications

Usage:
\tcma_roce_tos OPTIONS
Options:
\t-h              show this help
\t-d <dev>        use IB device <dev> (default mlx5_0)
\t-p <port>       use port <port> of IB device (default 1)
\t-t <tos>        set ToS of RoCE RDMA_CM applications (0)
"""


def getopts(argv):
    """bash ``getopts "d:t:hp:"``: the options it hands the case statement, errors said on stderr."""
    opts = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            break
        if not a.startswith("-") or a == "-":
            break
        j = 1
        while j < len(a):
            c = a[j]
            if c in "dtp":
                val = a[j + 1 :]
                if not val:
                    i += 1
                    if i >= len(argv):
                        sys.stderr.write(f"{PROG}: option requires an argument -- {c}\n")
                        return opts
                    val = argv[i]
                opts.append((c, val))
                break
            if c == "h":
                opts.append(("h", ""))
            else:
                sys.stderr.write(f"{PROG}: illegal option -- {c}\n")
            j += 1
        i += 1
    return opts


def kstrtou8(text):
    """The kernel's ``kstrtou8(buf, 0, ...)`` of what ``echo`` wrote (base 0: 0x hex, 0 octal)."""
    s = text.strip()
    if s.startswith("+"):
        s = s[1:]
    try:
        if s[:2].lower() == "0x":
            v = int(s[2:], 16)
        elif len(s) > 1 and s.startswith("0"):
            v = int(s[1:], 8)
        else:
            v = int(s, 10)
    except ValueError:
        return None
    return v if 0 <= v <= 255 and s.isalnum() else None


def main(argv):
    device, port, mode = "mlx5_0", "1", "-1"
    for c, val in getopts(argv):
        if c == "h":
            sys.stdout.write(USAGE)
            return 0
        if c == "d":
            device = val
        elif c == "p":
            port = val
        elif c == "t":
            mode = val
    if os.geteuid() != 0 and not os.environ.get("LAB_HW_DIR"):  # LAB_HW_DIR: a unit test's state
        sys.stdout.write("You must be root to run this\n")
        return 1
    # A lab host's kernel configfs (none on a kernel without it: the lab cannot bind a fake one into
    # its read-only /sys); a unit test's fake one under LAB_HW_DIR.
    cfs = os.path.join(nicmodel.hw_dir(), nicmodel.CONFIGFS) if os.environ.get("LAB_HW_DIR") else "/sys/kernel/config"
    cm = os.path.join(cfs, "rdma_cm")
    if not os.path.isdir(cm):
        sys.stdout.write("Module rdma_cm is not loaded or does not support configfs\n")
        return 1
    if not os.path.isdir(os.path.join(cm, device)):
        # The lab makes every known device's directory; the kernel refuses any other name.
        sys.stderr.write(f"mkdir: cannot create directory '{device}': No such device\n")
        sys.stdout.write(f"Failed to create configuration for {device}\n")
        return 1
    port_dir = os.path.join(cm, device, "ports", port)
    if not os.path.isdir(port_dir):
        sys.stdout.write(f"Device {device} port {port} does not exist\n")
        return 1
    path = os.path.join(port_dir, "default_roce_tos")
    try:
        number = int(mode, 10)  # bash's [ $MODE -ge 0 ]: decimal only
    except ValueError:
        number = None
        sys.stderr.write(f"/usr/sbin/{PROG}: line 98: [: {mode}: integer expression expected\n")
    if number is not None and number >= 0:
        tos = kstrtou8(mode)
        if tos is None:
            sys.stderr.write(f"/usr/sbin/{PROG}: line 99: echo: write error: Invalid argument\n")
        else:
            with open(path, "w", encoding="ascii") as f:
                f.write("%d\n" % tos)
    with open(path, encoding="ascii") as f:
        sys.stdout.write(f.read())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
