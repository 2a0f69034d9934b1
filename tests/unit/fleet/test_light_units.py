"""Light-lab pieces that need no root: addressing, the inventory it writes."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from clusterctl.errors import LabError
from clusterctl.inventory.loader import load_inventory_text
from clusterctl.lab import light


def test_address_for():
    assert light.address_for(0) == "127.1.0.1"
    assert light.address_for(249) == "127.1.0.250"
    assert light.address_for(250) == "127.1.1.1"
    assert light.address_for(999, "127.9") == "127.9.3.250"
    for bad in ("10.1", "127", "127.1.2", "127.x"):
        with pytest.raises(LabError):
            light.address_for(0, bad)
    with pytest.raises(LabError):
        light.address_for(light.MAX_HOSTS)


def test_inventory_text_loads_with_the_real_loader():
    specs = [light.HostSpec("lh0001", "127.1.0.1"), light.HostSpec("lh0002", "127.1.0.2", port=2222)]
    text = light.inventory_text(specs, identity_file=Path("/lab/keys/id_ed25519"), known_hosts=Path("/lab/known_hosts"))
    inv = load_inventory_text(text, "light.yaml")
    h1, h2 = inv.hosts["lh0001"], inv.hosts["lh0002"]
    assert (h1.address, h1.ssh.port, h2.ssh.port) == ("127.1.0.1", 22, 2222)
    assert h1.ssh.host_key_policy == "strict" and h1.ssh.known_hosts == "/lab/known_hosts"
    assert h1.ssh.identity_file == "/lab/keys/id_ed25519"


def test_listening_reads_proc_net_tcp():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    try:
        assert light._listening({("127.0.0.1", port)}) == set()
        srv.listen(1)
        assert light._listening({("127.0.0.1", port), ("127.0.0.1", 1)}) == {("127.0.0.1", port)}
    finally:
        srv.close()


def test_sshd_config_has_explicit_listen_address_and_extra_lines_first(tmp_path):
    spec = light.HostSpec("h", "127.1.0.9", 2200, extra_config=["SetEnv PATH=/x"])
    text = light._sshd_config(tmp_path, spec)
    lines = text.splitlines()
    assert lines[0] == "SetEnv PATH=/x"
    assert "ListenAddress 127.1.0.9:2200" in lines
    assert not any(line.startswith("ListenAddress 0.0.0.0") for line in lines)
