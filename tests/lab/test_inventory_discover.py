"""``inventory discover`` and ``inventory diff`` against real lab hosts (tier 2, root): the
probe and the engine search over SSH, an inventory written from them that validates and
agrees with the hosts, and the lab's own inventory agreeing with its hosts."""

from __future__ import annotations

import json

import pytest

from clusterctl.cli.main import main
from clusterctl.inventory.loader import load_inventory

pytestmark = pytest.mark.lab


def test_discover_then_diff_on_lab_hosts(lab, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    names = lab.names[:2]
    addresses = [lab.host(n).address for n in names]
    key = str(lab.lab_dir / "ssh" / "id_ed25519")
    out = tmp_path / "discovered.yaml"
    rc = main(["inventory", "discover", *addresses, "--identity", key, "--host-key-policy", "off", "-o", str(out)])
    assert rc == 0, capsys.readouterr().err
    inv = load_inventory(out)
    assert sorted(inv.hosts) == sorted(names)  # named by their hostnames, addressed as given
    h = inv.hosts[names[0]]
    assert h.address == addresses[0] and h.gpus.count == 8 and "H100" in h.gpus.model
    assert [n.role for n in h.nics].count("data") >= 1 and any(n.rdma_device for n in h.nics)
    assert inv.engines, "the lab hosts have vLLM executables under /opt"
    capsys.readouterr()
    rc = main(["inventory", "diff", ",".join(names), "-i", str(out), "--host-key-policy", "off", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["differences"] == [], doc
    # the lab's own inventory (another model spelling, H100-SXM5-80GB) agrees with its hosts too
    rc = main(["inventory", "diff", ",".join(names), "-i", str(lab.inventory), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["differences"] == [], doc
