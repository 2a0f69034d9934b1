"""The gateway's floating address: keepalived (VRRP) on every gateway host (docs/gateway.md).

:func:`render_vrrp` (pure) writes, per gateway host, ``/etc/keepalived/keepalived.conf``
(0600 root: it holds VRRP's password) and the health check keepalived runs every
``advert_s`` (``/etc/keepalived/clusterctl-check-nginx``, 0755 root: asks the local
nginx's loopback admin server for ``/gateway/health``).

Choices (the reasons are in docs/gateway.md):

* unicast VRRP to the other gateway hosts' inventory addresses (no multicast
  needed on the network);
* every host starts as BACKUP with ``nopreempt``: the address moves only when
  its holder fails, never back when a host with a higher priority returns (a
  move loses the streams in flight on the old holder);
* priorities by the order of ``gateway.hosts``: the first holds the address
  when all are healthy from the start;
* a failed check (nginx down or hung: two checks in a row) puts the host in
  FAULT: it gives the address up at once, the next host takes it;
* the check runs as root with ``enable_script_security`` (keepalived refuses a
  script any other user could change): Debian 12's keepalived 2.2.7 killed its
  own config test (``keepalived -t``, SIGTERM, no message) with ``script_user
  nobody`` on the lab; the script is root's, 0755, and only opens a loopback
  connection.
"""

from __future__ import annotations

import re
from clusterctl.gateway.render import REDACTED, GatewayFile, GatewayRenderError
from clusterctl.inventory.model import Inventory

CONF = "/etc/keepalived/keepalived.conf"
CHECK = "/etc/keepalived/clusterctl-check-nginx"
#: Written at the top of every file clusterctl owns: the node removes only files that carry it.
MARK = "# clusterctl gateway: floating address (generated; edits are overwritten)"
#: VRRP version 2 PASS authentication carries 8 characters.
PASSWORD_MAX = 8
_PASSWORD_OK = re.compile(r"^[!#-~]+$")  # printable, no space or '"'
TOP_PRIORITY = 200
PRIORITY_STEP = 10


def check_script(admin_port: int, timeout_s: int) -> str:
    """bash only (no curl on a minimal host): GET /gateway/health on the loopback admin server."""
    return f"""#!/bin/bash
{MARK}
# keepalived's track script: exit 0 while the local nginx answers /gateway/health with 200.
exec 3<>/dev/tcp/127.0.0.1/{admin_port} || exit 1
printf 'GET /gateway/health HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3 || exit 1
IFS= read -r -t {timeout_s} line <&3 || exit 1
case "$line" in
  "HTTP/1."?" 200 "*) exit 0 ;;
esac
exit 1
"""


def _password_line(password: str | None) -> str:
    if password is None:
        return REDACTED
    if len(password) > PASSWORD_MAX or not _PASSWORD_OK.match(password):
        raise GatewayRenderError(
            f"gateway.vip.password: VRRP's password is 1-{PASSWORD_MAX} printable characters "
            "without space or '\"' (keepalived would cut a longer one)"
        )
    return password


def render_vrrp(inv: Inventory, password: str | None) -> dict[str, tuple[GatewayFile, ...]]:
    """Per gateway host, keepalived's files; ``{}`` without ``gateway.vip``.

    ``password``: the VRRP password when ``gateway.vip.password`` is set (``None``: written as
    ``***``, for showing).
    """
    gw = inv.gateway
    if gw is None or gw.vip is None:
        return {}
    vip = gw.vip
    auth = ""
    if vip.password is not None:
        auth = f"    authentication {{\n        auth_type PASS\n        auth_pass {_password_line(password)}\n    }}\n"
    interval = vip.advert_s
    script = check_script(gw.admin_port, max(1, interval))
    out: dict[str, tuple[GatewayFile, ...]] = {}
    addresses = {h: inv.hosts[h].address for h in gw.hosts}
    for i, host in enumerate(gw.hosts):
        peers = "".join(f"        {addresses[p]}\n" for p in gw.hosts if p != host)
        conf = f"""{MARK}
# Gateway hosts: {', '.join(gw.hosts)}; this is {host}.
global_defs {{
    router_id clusterctl-{host}
    enable_script_security
    script_user root
}}

vrrp_script clusterctl_nginx {{
    script "{CHECK}"
    interval {interval}
    timeout {interval + 1}
    fall 2
    rise 2
}}

vrrp_instance clusterctl_gateway {{
    state BACKUP
    nopreempt
    interface {vip.interface}
    virtual_router_id {vip.router_id}
    priority {max(1, TOP_PRIORITY - PRIORITY_STEP * i)}
    advert_int {vip.advert_s}
    unicast_src_ip {addresses[host]}
    unicast_peer {{
{peers}    }}
{auth}    virtual_ipaddress {{
        {vip.address}/{vip.prefix} dev {vip.interface}
    }}
    track_script {{
        clusterctl_nginx
    }}
}}
"""
        out[host] = (
            GatewayFile(CONF, conf, mode=0o600, secret=vip.password is not None),
            GatewayFile(CHECK, script, mode=0o755),
        )
    return out
