"""ipv4_of_gid: the IPv4 address of a RoCE GID in the kernel's sysfs spelling and the compressed ones."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from clusterctl.probe.gid import ipv4_of_gid

PORT = Path(__file__).parents[2] / "fixtures/probe/sysroot_roce/sys/class/infiniband/mlx5_0/ports/1/gids"


def test_the_sysfs_table_of_a_roce_port_reads_as_its_link_local_and_ipv4_gids() -> None:
    got = {int(f.name): ipv4_of_gid(f.read_text()) for f in PORT.iterdir()}
    assert got[0] is None and got[1] is None  # fe80:... (RoCE v1/v2 link-local)
    assert got[2] == got[3] == ipaddress.IPv4Address("10.77.0.11")


@pytest.mark.parametrize(
    "gid", ["0000:0000:0000:0000:0000:ffff:0a4d:010b", "::ffff:10.77.1.11", "::ffff:a4d:10b", " ::FFFF:0A4D:010B\n"]
)
def test_every_spelling_of_one_gid_is_the_same_address(gid: str) -> None:
    assert ipv4_of_gid(gid) == ipaddress.IPv4Address("10.77.1.11")


@pytest.mark.parametrize(
    "gid", ["fe80:0000:0000:0000:ba3f:d2ff:fe10:0001", "fe80::1", "2001:db8::1", "", "10.77.1.11", "not a gid", None]
)
def test_anything_else_carries_no_ipv4_address(gid: object) -> None:
    assert ipv4_of_gid(gid) is None
