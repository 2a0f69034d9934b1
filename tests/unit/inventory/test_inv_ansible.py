"""Importing Ansible inventories: the examples of Ansible's inventory guide round-trip."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterctl.errors import ConfigError
from clusterctl.inventory.ansible import expand_ansible_range, import_ansible, to_yaml
from clusterctl.inventory.loader import load_inventory_text
from clusterctl.inventory.nodeset import expand

ANSIBLE = Path(__file__).resolve().parents[2] / "fixtures" / "inventory" / "ansible"


def resolved(path: Path):
    """Import, render, and load the result with clusterctl's own loader."""
    result = import_ansible(path)
    return load_inventory_text(to_yaml(result.data), str(path) + ".converted")


def membership(inv) -> dict[str, list[str]]:
    return {g: sorted(m) for g, m in inv.groups.items()}


@pytest.mark.parametrize("stem", ["basic", "multi", "ranges", "vars"])
def test_ini_and_yaml_forms_import_identically(stem: str) -> None:
    ini = import_ansible(ANSIBLE / f"{stem}.ini")
    yml = import_ansible(ANSIBLE / f"{stem}.yaml")
    assert ini.data == yml.data
    a, b = resolved(ANSIBLE / f"{stem}.ini"), resolved(ANSIBLE / f"{stem}.yaml")
    assert list(a.hosts) == list(b.hosts)
    assert membership(a) == membership(b)
    for name in a.hosts:
        assert a.hosts[name].vars == b.hosts[name].vars
        assert a.hosts[name].ssh == b.hosts[name].ssh
        assert a.hosts[name].address == b.hosts[name].address


def test_basic_example() -> None:
    inv = resolved(ANSIBLE / "basic.ini")
    assert set(inv.hosts) == {
        "mail.example.com",
        "foo.example.com",
        "bar.example.com",
        "one.example.com",
        "two.example.com",
        "three.example.com",
    }
    assert membership(inv) == {
        "dbservers": ["one.example.com", "three.example.com", "two.example.com"],
        "ungrouped": ["mail.example.com"],
        "webservers": ["bar.example.com", "foo.example.com"],
    }
    # the guide's other YAML form (everything under all:) is the same inventory
    assert import_ansible(ANSIBLE / "basic-all.yaml").data == import_ansible(ANSIBLE / "basic.ini").data


def test_children_are_flattened() -> None:
    inv = resolved(ANSIBLE / "multi.ini")
    assert inv.groups["prod"] == inv.groups["east"]
    assert sorted(inv.groups["test"]) == ["bar.example.com", "three.example.com"]
    assert inv.hosts["foo.example.com"].groups == ("prod", "webservers", "east")


def test_ranges() -> None:
    inv = resolved(ANSIBLE / "ranges.ini")
    assert inv.groups["webservers"] == [f"www{i:02d}.example.com" for i in range(1, 51)]
    assert inv.groups["stride"] == [f"www{i:02d}.example.com" for i in range(1, 51, 2)]
    assert inv.groups["databases"] == [f"db-{c}.example.com" for c in "abcdef"]


@pytest.mark.parametrize(
    "pattern,expected",
    [
        ("www[01:03].example.com", ["www01.example.com", "www02.example.com", "www03.example.com"]),
        ("db-[99:101]-node", ["db-99-node", "db-100-node", "db-101-node"]),
        ("h[1:7:3]", ["h1", "h4", "h7"]),
        ("h[a:c]", ["ha", "hb", "hc"]),
        ("r[1:2]n[a:b]", ["r1na", "r1nb", "r2na", "r2nb"]),
        ("plain", ["plain"]),
    ],
)
def test_ansible_ranges(pattern: str, expected: list[str]) -> None:
    assert expand_ansible_range(pattern) == expected


@pytest.mark.parametrize("bad", ["h[1:]", "h[3:1]", "h[1:a]", "h[1:3:0]", "h[1-3]", "h[ab:c]"])
def test_bad_ansible_ranges(bad: str) -> None:
    with pytest.raises(ValueError):
        expand_ansible_range(bad)


def test_variables_and_precedence() -> None:
    inv = resolved(ANSIBLE / "vars.ini")
    host1, host2 = inv.hosts["host1"], inv.hosts["host2"]
    assert host1.vars["http_port"] == 80 and host1.vars["maxRequestsPerChild"] == 808
    assert host1.vars["ntp_server"] == "ntp.atlanta.example.com"  # [atlanta:vars]
    assert host1.vars["halon_system_timeout"] == 30  # [southeast:vars], a child of usa
    assert "ntp_server" not in inv.hosts["host3"].vars  # raleigh is not atlanta
    assert host2.vars["http_port"] == 303
    assert inv.hosts["jumper"].address == "192.0.2.50" and inv.hosts["jumper"].ssh.port == 5555
    assert inv.hosts["badwolf.example.com"].ssh.port == 5309
    assert set(inv.groups["usa"]) == {"host1", "host2", "host3", "host4"}
    # groups are written parents first, so children override parents as in Ansible
    order = list(inv.groups)
    assert order.index("usa") < order.index("southeast") < order.index("atlanta")


def test_group_vars_host_vars_and_ssh_mapping() -> None:
    result = import_ansible(ANSIBLE / "dirs" / "hosts.ini")
    inv = load_inventory_text(to_yaml(result.data), str(ANSIBLE / "dirs" / "converted.yaml"))
    web1, web2, db1 = inv.hosts["web1"], inv.hosts["web2"], inv.hosts["db1"]
    assert web1.ssh.user == "deploy" and web1.ssh.port == 2222  # ansible_port from group_vars/all.yml
    assert web1.ssh.identity_file.endswith("/.ssh/ops_ed25519")  # [all:vars]
    assert web1.vars == {"ntp_server": "ntp.example.com", "http_port": 8080, "worker_processes": 16}
    assert web2.vars["http_port"] == 9090 and web2.address == "10.1.0.12"  # host_vars/web2.yml
    assert db1.address == "10.1.0.5" and db1.ssh.become is True
    assert "hunter2" not in to_yaml(result.data)
    assert any("ansible_become_password dropped" in w for w in result.warnings)
    assert not any("hunter2" in w for w in result.warnings)


def test_unknown_vars_kept_and_bad_port_kept_under_vars(tmp_path: Path) -> None:
    f = tmp_path / "hosts"
    f.write_text("[g]\nh1 ansible_port=ssh foo='a b' ansible_connection=local\n")
    result = import_ansible(f)
    assert result.data["hosts"]["h1"]["vars"] == {"ansible_port": "ssh", "foo": "a b", "ansible_connection": "local"}
    assert any("not a valid port" in w for w in result.warnings)


def test_broken_ini_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "hosts"
    f.write_text("[ok]\nh1\n[bad:kind]\nh2\n[g:vars]\nnovalue\n[h]\nh3 x\n")
    with pytest.raises(ConfigError) as e:
        import_ansible(f)
    text = str(e.value)
    assert f"{f}:3: bad section header" in text
    assert f"{f}:6: expected key=value" in text
    assert f"{f}:8: expected key=value after the host name" in text


def test_output_is_folded_yaml() -> None:
    text = to_yaml(import_ansible(ANSIBLE / "ranges.ini").data, source="ranges.ini")
    assert text.startswith("# Converted from ranges.ini")
    assert "hosts: www[01-50].example.com" in text
    assert expand("www[01-50].example.com")[0] == "www01.example.com"
