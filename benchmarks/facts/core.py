"""clusterctl's core API alone: collect_facts(Fleet(hosts)) from an inventory.

Usage: core.py INVENTORY FANOUT  (prints {"ok": n, "n": N}).
"""

import json
import sys

from clusterctl.fleet import Fleet
from clusterctl.inventory.loader import load_inventory
from clusterctl.probe.run import collect_facts


def main() -> None:
    inv = load_inventory(sys.argv[1])
    with Fleet(list(inv.hosts.values()), fanout=int(sys.argv[2]), connect_timeout=30) as f:
        res = collect_facts(f)
    print(json.dumps({"ok": sum(1 for r in res.values() if r.ok), "n": len(res)}))


if __name__ == "__main__":
    main()
