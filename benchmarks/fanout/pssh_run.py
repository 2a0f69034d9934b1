"""parallel-ssh (native client): run `true` on every host.

Usage: pssh_run.py HOSTS_FILE KEY FANOUT  (prints {"ok": n, "n": N}).
"""

import json
import sys

from pssh.clients import ParallelSSHClient


def main() -> None:
    hosts = open(sys.argv[1]).read().split()
    client = ParallelSSHClient(hosts, user="root", pkey=sys.argv[2], pool_size=int(sys.argv[3]))
    output = client.run_command("true", stop_on_errors=False)
    client.join(output)
    ok = sum(1 for o in output if o.exception is None and o.exit_code == 0)
    print(json.dumps({"ok": ok, "n": len(hosts)}))


if __name__ == "__main__":
    main()
