"""RoCE GIDs as the probe records them.

The collector keeps each GID as the kernel writes it in
``/sys/class/infiniband/DEV/ports/N/gids/I``: eight groups of four hex digits, an IPv4 RoCE
GID being the IPv4-mapped IPv6 address (``0000:0000:0000:0000:0000:ffff:0a4d:010b`` for
10.77.1.11).  MLNX_OFED's ``show_gids`` and hand-written data use the compressed forms
(``::ffff:10.77.1.11``, ``::ffff:a4d:10b``).  Every reader compares addresses through
:func:`ipv4_of_gid`, never by the text.
"""

from __future__ import annotations

import ipaddress


def ipv4_of_gid(gid: object) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv4-mapped GID carries, in any IPv6 spelling; ``None`` for any other
    GID (a link-local RoCE v1/v2 GID, an IPv6 one) or text that is not an IPv6 address."""
    try:
        return ipaddress.IPv6Address(str(gid).strip()).ipv4_mapped
    except ValueError:
        return None
