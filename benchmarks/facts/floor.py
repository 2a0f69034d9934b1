"""The facts floor: bare paramiko connect + one command fed PAYLOAD_FILE on stdin, per host.

Usage: floor.py HOSTS_FILE KEY FANOUT PAYLOAD_FILE COMMAND
(one address per line; prints {"ok": n, "n": N}).  A host is ok when the
command exits 0 and, unless COMMAND ends in ``-c pass``, its last stdout
line is a JSON object.  PAYLOAD_FILE ``/dev/null``: nothing on stdin.  No host key checking and one key loaded once: the
cheapest possible client, at the same concurrency as the tool it is compared with.
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import paramiko


class _Accept(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client, hostname, key):  # the floor skips verification on purpose
        return


def one(addr: str, key: paramiko.PKey, command: str, payload: bytes, want_json: bool) -> bool:
    c = paramiko.SSHClient()
    c.set_missing_host_key_policy(_Accept())
    try:
        c.connect(addr, username="root", pkey=key, look_for_keys=False, allow_agent=False, timeout=30)
        chan = c.get_transport().open_session(timeout=30)
        chan.exec_command(command)
        chan.sendall(payload)
        chan.shutdown_write()
        out = bytearray()
        while True:
            data = chan.recv(65536)
            if not data:
                break
            out += data
        if chan.recv_exit_status() != 0:
            return False
        if not want_json:
            return True
        lines = bytes(out).strip().splitlines()
        return bool(lines) and lines[-1].lstrip().startswith(b"{")
    except Exception:
        return False
    finally:
        c.close()


def main() -> None:
    hosts = open(sys.argv[1]).read().split()
    key = paramiko.Ed25519Key.from_private_key_file(sys.argv[2])
    payload = open(sys.argv[4], "rb").read()
    command = sys.argv[5]
    want_json = not command.endswith("-c pass")
    with ThreadPoolExecutor(int(sys.argv[3])) as ex:
        ok = sum(ex.map(lambda a: one(a, key, command, payload, want_json), hosts))
    print(json.dumps({"ok": ok, "n": len(hosts)}))


if __name__ == "__main__":
    main()
