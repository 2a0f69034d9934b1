"""clusterctl's core API alone: Fleet(hosts).run("true") from an inventory.

Usage: core.py INVENTORY FANOUT  (prints {"ok": n, "n": N}).
"""

import json
import sys

from clusterctl.fleet import Fleet
from clusterctl.inventory.loader import load_inventory


def main() -> None:
    inv = load_inventory(sys.argv[1])
    with Fleet(list(inv.hosts.values()), fanout=int(sys.argv[2]), connect_timeout=30) as f:
        res = f.run("true")
    print(json.dumps({"ok": len(res) - len(res.failed_hosts()), "n": len(res)}))


if __name__ == "__main__":
    main()
