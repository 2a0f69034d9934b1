"""State keyed per cluster (issue 28): two inventories never share state, another cluster's state is refused
(exit 3), un-keyed state is adopted once by the first cluster that uses it, and the commands say which cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterctl.cli.main import main
from clusterctl.clusterstate import ClusterMismatch, bind, cluster_name, default_cluster_name
from clusterctl.inventory.loader import load_inventory_text

INV = """\
version: 1
{cluster}hosts:
{hosts}
"""


def write_inv(path: Path, hosts: dict[str, str], cluster: str | None = None) -> Path:
    path.write_text(
        INV.format(
            cluster=f"cluster: {cluster}\n" if cluster else "",
            hosts="".join(f"  {n}: {{address: {a}}}\n" for n, a in hosts.items()),
        )
    )
    return path


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("CLUSTERCTL_INVENTORY", raising=False)
    monkeypatch.delenv("CLUSTERCTL_STATE_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path / "xdg" / "clusterctl"


def test_the_cluster_name_is_the_inventorys_else_a_stable_name_per_file(tmp_path: Path) -> None:
    named = load_inventory_text("version: 1\ncluster: prod-east\nhosts:\n  a: {address: 10.0.0.1}\n", "x.yaml")
    assert cluster_name(named) == "prod-east"
    a, b = (
        default_cluster_name(str(tmp_path / "inventory.yaml")),
        default_cluster_name(str(tmp_path / "x" / "inventory.yaml")),
    )
    assert a.startswith("inventory-") and a != b and a == default_cluster_name(str(tmp_path / "inventory.yaml"))


def test_a_bad_cluster_name_is_an_inventory_error_at_its_line(tmp_path: Path, state: Path, capsys) -> None:
    p = tmp_path / "inv.yaml"
    p.write_text("version: 1\ncluster: ../etc\nhosts:\n  a: {address: 10.0.0.1}\n")
    assert main(["inventory", "validate", "-i", str(p)]) == 3
    cap = capsys.readouterr()
    assert f"{p}:2: cluster: '../etc' is not a cluster name" in cap.out + cap.err


def test_two_clusters_keep_their_own_cordons(tmp_path: Path, state: Path, capsys) -> None:
    lab = write_inv(tmp_path / "lab.yaml", {"gpu01": "10.38.0.1", "gpu02": "10.38.0.2"})
    prod = write_inv(tmp_path / "prod.yaml", {"gpu01": "10.0.0.1", "gpu02": "10.0.0.2"}, cluster="prod")
    assert main(["cordon", "gpu01", "--reason", "lab maintenance", "-i", str(lab)]) == 0
    capsys.readouterr()
    assert main(["cordons", "-i", str(prod), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []  # the lab's cordon is not prod's
    assert main(["cordons", "-i", str(lab), "--json"]) == 0
    assert [c["target"] for c in json.loads(capsys.readouterr().out)] == ["gpu01"]
    assert (state / "clusters" / "prod" / "cluster.json").is_file()
    assert (state / "clusters" / default_cluster_name(str(lab)) / "deploy").is_dir()


def test_an_inventory_whose_hosts_are_not_the_states_is_refused(tmp_path: Path, state: Path, capsys) -> None:
    first = write_inv(tmp_path / "a.yaml", {"gpu01": "10.0.0.1", "gpu02": "10.0.0.2"}, cluster="prod")
    assert main(["cordon", "gpu02", "--reason", "bad fan", "-i", str(first)]) == 0
    other = write_inv(tmp_path / "b.yaml", {"gpu01": "10.38.0.1"}, cluster="prod")  # same name, other hosts
    capsys.readouterr()
    assert main(["cordons", "-i", str(other)]) == 3
    err = capsys.readouterr().err
    assert "state of cluster 'prod'" in err and "belongs to other hosts (gpu01, gpu02" in err
    assert "Refusing to act on another cluster's state" in err and "cluster.json" in err
    # The same cluster, grown by a host and with one gone: it shares a host, so it goes on.
    grown = write_inv(tmp_path / "c.yaml", {"gpu02": "10.0.0.2", "gpu03": "10.0.0.3"}, cluster="prod")
    assert main(["cordons", "-i", str(grown), "--json"]) == 0
    assert [c["target"] for c in json.loads(capsys.readouterr().out)] == ["gpu02"]
    rec = json.loads((state / "clusters" / "prod" / "cluster.json").read_text())
    assert rec["hosts"] == {"gpu02": "10.0.0.2", "gpu03": "10.0.0.3"}  # the record follows the inventory


def test_un_keyed_state_is_adopted_once_by_the_first_cluster(tmp_path: Path, state: Path, capsys) -> None:
    (state / "deploy").mkdir(parents=True)
    (state / "deploy" / "state.json").write_text('{"cordons": {"gpu01": {"reason": "old", "who": "x", "when": "t"}}}')
    (state / "acks.json").write_text("{}")
    inv = write_inv(tmp_path / "inv.yaml", {"gpu01": "10.0.0.1"}, cluster="prod")
    inv2 = write_inv(tmp_path / "inv2.yaml", {"gpu01": "10.1.0.1"}, cluster="staging")
    before = {p.relative_to(state) for p in state.rglob("*")}
    assert main(["cordons", "-i", str(inv), "--json"]) == 0
    out = capsys.readouterr()
    assert out.err.count("now belongs to cluster 'prod'") == 1
    keyed = state / "clusters" / "prod"
    assert {p.relative_to(keyed) for p in keyed.rglob("*")} >= before  # nothing lost
    assert sorted(p.name for p in state.iterdir()) == ["clusters"]
    assert json.loads((state / "clusters" / "ADOPTED.json").read_text())["cluster"] == "prod"
    assert main(["cordons", "-i", str(inv), "--json"]) == 0
    assert "belongs to cluster" not in capsys.readouterr().err  # said once
    assert main(["cordons", "-i", str(inv2), "--json"]) == 0  # another cluster starts with its own
    cap = capsys.readouterr()
    assert json.loads(cap.out) == [] and "belongs to cluster" not in cap.err


def test_bind_refuses_without_touching_the_state(tmp_path: Path) -> None:
    root = tmp_path / "state"
    a = load_inventory_text("version: 1\ncluster: c\nhosts:\n  n1: {address: 10.0.0.1}\n", str(tmp_path / "a.yaml"))
    b = load_inventory_text("version: 1\ncluster: c\nhosts:\n  n1: {address: 10.9.9.9}\n", str(tmp_path / "b.yaml"))
    bound = bind(a, root)
    assert bound.state_dir == root / "clusters" / "c" and bound.adopted == []
    record = (bound.state_dir / "cluster.json").read_text()
    with pytest.raises(ClusterMismatch):
        bind(b, root)  # same name, the one host renumbered: not provably the same cluster
    assert (bound.state_dir / "cluster.json").read_text() == record


def test_status_json_and_doctor_name_the_cluster(tmp_path: Path, state: Path, capsys) -> None:
    inv = write_inv(tmp_path / "inv.yaml", {"gpu01": "10.0.0.1"}, cluster="prod")
    assert main(["status", "-i", str(inv), "--json", "--window", "0", "--connect-timeout", "0.5"]) in (0, 1, 2, 3)
    doc = json.loads(capsys.readouterr().out)
    assert doc["cluster"] == "prod" and doc["state_dir"] == str(state / "clusters" / "prod")
