"""The floor: bare paramiko connect + `true` per host, ThreadPoolExecutor(fanout).

Usage: floor.py HOSTS_FILE KEY FANOUT  (one address per line; prints {"ok": n, "n": N}).
No host key checking (the cheapest possible client), one key loaded once.
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import paramiko


class _Accept(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client, hostname, key):  # the floor skips verification on purpose
        return


def one(addr: str, key: paramiko.PKey) -> bool:
    c = paramiko.SSHClient()
    c.set_missing_host_key_policy(_Accept())
    try:
        c.connect(addr, username="root", pkey=key, look_for_keys=False, allow_agent=False, timeout=30)
        _, out, _ = c.exec_command("true")
        return out.channel.recv_exit_status() == 0
    except Exception:
        return False
    finally:
        c.close()


def main() -> None:
    hosts = open(sys.argv[1]).read().split()
    key = paramiko.Ed25519Key.from_private_key_file(sys.argv[2])
    with ThreadPoolExecutor(int(sys.argv[3])) as ex:
        ok = sum(ex.map(lambda a: one(a, key), hosts))
    print(json.dumps({"ok": ok, "n": len(hosts)}))


if __name__ == "__main__":
    main()
