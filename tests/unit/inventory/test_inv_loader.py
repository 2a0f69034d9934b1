"""The inventory loader: merging, paths, ssh_config, and every validation error at its line."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from clusterctl.errors import InventoryError
from clusterctl.inventory.loader import load_inventory, load_inventory_text
from clusterctl.inventory.model import GpuRef

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "inventory"
EXAMPLES = Path(__file__).resolve().parents[3] / "inventories"

BASE = """\
version: 1
defaults:
  gpus: {count: 8, model: H100, memory_gib: 80, interconnect: nvlink}
hosts:
  gpu[01-04]:
    address: 10.0.0.[11-14]
engines:
  v11: {path: /opt/v/bin/vllm, version: 0.11.0}
models:
  m8:
    path: /models/m8
    arch: {layers: 36, hidden_size: 4096, attention_heads: 32, kv_heads: 8, head_dim: 128}
"""


def load(text: str, force: bool = False, name: str = "inv.yaml"):
    return load_inventory_text(textwrap.dedent(text), name, force=force)


def problems_of(text: str, force: bool = False) -> list[tuple[int, str]]:
    with pytest.raises(InventoryError) as e:
        load(text, force=force)
    return [(p.line, str(p)) for p in e.value.problems]


# ------------------------------------------------------------------ examples


@pytest.mark.parametrize("name", ["example-16xh100-roce.yaml", "example-pcie-small.yaml"])
def test_example_inventories_validate(name: str) -> None:
    inv = load_inventory(EXAMPLES / name)
    assert inv.hosts and inv.instances and inv.templates
    assert inv.warnings == []


def test_realistic_example_contents() -> None:
    inv = load_inventory(EXAMPLES / "example-16xh100-roce.yaml")
    assert list(inv.hosts) == [f"gpu{i:02d}" for i in range(1, 17)]
    assert inv.hosts["gpu16"].address == "10.0.0.26"
    assert inv.hosts["gpu03"].groups == ("rack1", "canary")
    assert inv.hosts["gpu12"].labels["leaf"] == "leaf2"
    assert [n.rdma_device for n in inv.hosts["gpu01"].nics_with_role("data")] == [f"mlx5_{i}" for i in range(8)]
    assert inv.fabric.pfc_priority == 3 and inv.fabric.roce_dscp == 26
    assert inv.models["qwen3-32b"].arch.layers == 64
    assert inv.instances["llama70-a"].tp_size == 8
    assert inv.instances["qwen32-a"].placement == tuple(GpuRef("gpu01", i) for i in range(4))


# ---------------------------------------------------------------- precedence


def test_precedence_defaults_groups_in_order_then_host() -> None:
    inv = load("""\
        version: 1
        defaults:
          ssh: {user: root, port: 22}
          vars: {a: default, b: default, c: default, d: default}
          labels: {rack: none}
          gpus: {count: 8, model: H100, interconnect: nvlink}
        groups:
          first:
            hosts: n[1-2]
            ssh: {user: ops}
            vars: {b: first, c: first}
            labels: {rack: r1}
          second:
            hosts: n1
            vars: {c: second}
            gpus: {count: 4}
        hosts:
          n1:
            vars: {d: host}
            ssh: {port: 2222}
          n2: {}
        """)
    n1, n2 = inv.hosts["n1"], inv.hosts["n2"]
    assert n1.vars == {"a": "default", "b": "first", "c": "second", "d": "host"}
    assert (n1.ssh.user, n1.ssh.port) == ("ops", 2222)
    assert n1.gpus.count == 4 and n1.gpus.model == "H100"  # gpus merge key by key
    assert n1.labels == {"rack": "r1"}
    assert n2.vars == {"a": "default", "b": "first", "c": "first", "d": "default"}
    assert n2.gpus.count == 8 and n2.ssh.port == 22
    assert n1.groups == ("first", "second") and inv.groups == {"first": ["n1", "n2"], "second": ["n1"]}


def test_group_order_decides_not_host_groups_list() -> None:
    inv = load("""\
        version: 1
        groups:
          a: {vars: {x: a}}
          b: {vars: {x: b}}
        hosts:
          h1: {groups: [b, a]}
        """)
    assert inv.hosts["h1"].vars["x"] == "b"
    assert inv.hosts["h1"].groups == ("a", "b")


def test_nics_list_is_replaced_not_merged() -> None:
    inv = load("""\
        version: 1
        defaults:
          nics: [{netdev: eth0, role: management}, {netdev: eth1, rdma_device: mlx5_0}]
        hosts:
          h1:
            nics: [{netdev: eth9, role: storage, speed_gbps: 200}]
          h2: {}
        """)
    assert [n.netdev for n in inv.hosts["h1"].nics] == ["eth9"]
    assert [n.netdev for n in inv.hosts["h2"].nics] == ["eth0", "eth1"]
    inv.hosts["h2"].nics[0].netdev = "changed"  # hosts do not share NIC objects
    assert (
        load("""\
        version: 1
        defaults: {nics: [{netdev: eth0}]}
        hosts: {a: {}, b: {}}
        """)
        .hosts["b"]
        .nics[0]
        .netdev
        == "eth0"
    )


def test_defaults_filled_after_merge() -> None:
    h = load("version: 1\nhosts: {h1: {}}\n").hosts["h1"]
    assert h.address == "h1"
    assert (h.ssh.port, h.ssh.host_key_policy, h.ssh.become) == (22, "accept-new", False)


def test_yaml_anchors_and_merge_keys() -> None:
    inv = load("""\
        version: 1
        hosts:
          a: &base
            labels: {rack: r1}
            vars: {x: 1}
          b:
            <<: *base
            vars: {x: 2}
        """)
    assert inv.hosts["b"].labels == {"rack": "r1"} and inv.hosts["b"].vars == {"x": 2}


# --------------------------------------------------------------------- paths


def test_paths_expand_home_and_resolve_against_inventory_dir(tmp_path: Path) -> None:
    f = tmp_path / "site" / "inv.yaml"
    f.parent.mkdir()
    f.write_text("version: 1\ndefaults:\n  ssh: {identity_file: keys/id, known_hosts: ~/kh}\nhosts: {h: {}}\n")
    h = load_inventory(f).hosts["h"]
    assert h.ssh.identity_file == str(tmp_path / "site" / "keys" / "id")
    assert h.ssh.known_hosts == os.path.expanduser("~/kh")


def test_unreadable_file_is_an_inventory_error(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as e:
        load_inventory(tmp_path / "missing.yaml")
    assert "missing.yaml: cannot read the inventory" in str(e.value)


# ---------------------------------------------------------------- ssh_config


def test_ssh_config_fills_only_what_the_inventory_leaves_unset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inc = tmp_path / "extra.conf"
    inc.write_text("Host gpu02\n  ProxyJump jump.example.com\n")
    cfg = tmp_path / "config"
    cfg.write_text(
        textwrap.dedent(f"""\
        Include {inc}
        Host gpu*
          User admin
          Port 2200
          IdentityFile /keys/cluster
          ForwardAgent yes
        Host gpu01
          HostName gpu01.mgmt.example.com
        Host *
          ServerAliveInterval 5
        """)
    )
    monkeypatch.setenv("CLUSTERCTL_SSH_CONFIG", str(cfg))
    inv = load("""\
        version: 1
        hosts:
          gpu01: {}
          gpu02: {address: 10.0.0.2, ssh: {user: ops}}
        """)
    g1, g2 = inv.hosts["gpu01"], inv.hosts["gpu02"]
    assert g1.address == "gpu01.mgmt.example.com"
    assert (g1.ssh.user, g1.ssh.port, g1.ssh.identity_file, g1.ssh.proxy_jump) == ("admin", 2200, "/keys/cluster", None)
    assert (g2.address, g2.ssh.user, g2.ssh.proxy_jump) == ("10.0.0.2", "ops", "jump.example.com")
    joined = "\n".join(inv.warnings)
    assert "'forwardagent' (hosts gpu[01-02]) is ignored" in joined
    assert "'serveraliveinterval' (hosts gpu[01-02]) is ignored" in joined


def test_ssh_config_match_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "config"
    cfg.write_text("Match host gpu01\n  User matched\nHost *\n  User fallback\n")
    monkeypatch.setenv("CLUSTERCTL_SSH_CONFIG", str(cfg))
    inv = load("version: 1\nhosts: {gpu01: {}, gpu02: {}}\n")
    assert (inv.hosts["gpu01"].ssh.user, inv.hosts["gpu02"].ssh.user) == ("matched", "fallback")


def test_ssh_config_can_be_disabled_in_the_inventory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "config"
    cfg.write_text("Host *\n  User admin\n")
    monkeypatch.setenv("CLUSTERCTL_SSH_CONFIG", str(cfg))
    text = "version: 1\ndefaults:\n  ssh: {use_ssh_config: %s}\nhosts: {h: {}}\n"
    assert load(text % "true").hosts["h"].ssh.user == "admin"
    assert load(text % "false").hosts["h"].ssh.user is None


def test_broken_ssh_config_is_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "config"
    cfg.write_text("Host h\n  Port notanumber\n")
    monkeypatch.setenv("CLUSTERCTL_SSH_CONFIG", str(cfg))
    inv = load("version: 1\nhosts: {h: {}}\n")
    assert inv.hosts["h"].ssh.port == 22
    assert any("not a number" in w for w in inv.warnings)


# ------------------------------------------------- every error at its line
# Each case marks the line the problem must point at with "# <-".

ERRORS = {
    "yaml syntax": ("version: 1\nhosts:\n\th1: {}  # <-\n", "YAML syntax error: found character '\\t'"),
    "missing version": ("hosts: {h: {}}  # <-\n", "missing 'version: 1'"),
    "wrong version": ("version: 2  # <-\n", "reads schema 1, not 2"),
    "unknown top key": ("version: 1\nhostz: {}  # <-\n", "unknown key 'hostz'; did you mean 'hosts'?"),
    "unknown ssh key": ("version: 1\ndefaults:\n  ssh:\n    prot: 22  # <-\n", "did you mean 'port'?"),
    "port type": (
        "version: 1\nhosts:\n  h:\n    ssh: {port: '22'}  # <-\n",
        "expected an integer 1-65535, got string '22'",
    ),
    "port range": ("version: 1\nhosts:\n  h:\n    ssh:\n      port: 0  # <-\n", "out of range 1-65535"),
    "policy": (
        "version: 1\ndefaults:\n  ssh:\n    host_key_policy: yolo  # <-\n",
        "'yolo' is not one of accept-new, strict, off",
    ),
    "become type": ("version: 1\ndefaults:\n  ssh:\n    become: sudo  # <-\n", "expected true or false"),
    "use_ssh_config outside defaults": (
        "version: 1\nhosts:\n  h:\n    ssh:\n      use_ssh_config: false  # <-\n",
        "only allowed in defaults.ssh",
    ),
    "duplicate host": (
        "version: 1\nhosts:\n  n[1-3]: {}\n  n2: {}  # <-\n",
        "host n2 is defined twice (first at line 3)",
    ),
    "duplicate in one range": ("version: 1\nhosts:\n  n[1-3,2]: {}  # <-\n", "host n2 is defined twice"),
    "duplicate yaml key": ("version: 1\nhosts:\n  n1: {}\n  n1: {}  # <-\n", "duplicate key 'n1' (first at line 3)"),
    "bad range key": ("version: 1\nhosts:\n  n[3-1]: {}  # <-\n", "goes backwards"),
    "address length": (
        "version: 1\nhosts:\n  n[1-3]:\n    address: 10.0.0.[1-2]  # <-\n",
        "gives 2 address(es) for 3 host(s)",
    ),
    "bad ip": ("version: 1\nhosts:\n  n1:\n    address: 10.0.0.256  # <-\n", "'10.0.0.256' is not a valid IP address"),
    "bad hostname": (
        "version: 1\nhosts:\n  n1:\n    address: 'bad_host!'  # <-\n",
        "neither an IP address nor a host name",
    ),
    "label value": (
        "version: 1\nhosts:\n  n1:\n    labels:\n      rack: [1, 2]  # <-\n",
        "a label value must be a string or number",
    ),
    "gpu interconnect": (
        "version: 1\ndefaults:\n  gpus: {count: 8, interconnect: nvswitch}  # <-\n",
        "'nvswitch' is not one of nvlink, pcie",
    ),
    "nic role": (
        "version: 1\ndefaults:\n  nics:\n    - {netdev: eth0, role: mgmt}  # <-\n",
        "'mgmt' is not one of management, data, storage",
    ),
    "nic without netdev": ("version: 1\ndefaults:\n  nics:\n    - {role: data}  # <-\n", "missing 'netdev'"),
    "fabric range": ("version: 1\nfabric:\n  roce_dscp: 64  # <-\n", "fabric.roce_dscp: 64 is out of range 0-63"),
    "undefined group": (
        "version: 1\ngroups: {rack1: {}}\nhosts:\n  n1:\n    groups: [rakc1]  # <-\n",
        "group 'rakc1' of host n1 is not defined in 'groups'; did you mean 'rack1'?",
    ),
    "group member unknown": (
        "version: 1\ngroups:\n  g:\n    hosts: n[1-3]  # <-\nhosts: {n1: {}}\n",
        "n[2-3] not defined in 'hosts'",
    ),
    "reserved group": ("version: 1\ngroups:\n  all: {}  # <-\n", "'all' is reserved"),
    "engine version float": (
        "version: 1\nengines:\n  e:\n    path: /x\n    version: 0.10  # <-\n",
        "expected a string, got number 0.1; quote it",
    ),
    "model without path": ("version: 1\nmodels:\n  m: {version: '1'}  # <-\n", "models.m: missing 'path'"),
    "arch heads": (
        "version: 1\nmodels:\n  m:\n    path: /m\n    arch: {attention_heads: 32, kv_heads: 6}  # <-\n",
        "must be a multiple of kv_heads (6)",
    ),
}

INSTANCE_ERRORS = {
    "undefined model": (
        "    model: m9  # <-\n    engine: v11\n    placement: [gpu01:0]\n    port: 8000\n",
        "model 'm9' is not defined in 'models'",
    ),
    "undefined engine": (
        "    model: m8\n    engine: v12  # <-\n    placement: [gpu01:0]\n    port: 8000\n",
        "engine 'v12' is not defined in 'engines'; did you mean 'v11'?",
    ),
    "gpu index": (
        "    model: m8\n    engine: v11\n    placement: [gpu01:0, gpu01:8]  # <-\n    port: 8000\n",
        "gpu01:8 does not exist (gpu01 has GPUs 0-7)",
    ),
    "unknown host": (
        "    model: m8\n    engine: v11\n    placement: gpu09:[0-1]  # <-\n    port: 8000\n",
        "host 'gpu09' is not defined in 'hosts'",
    ),
    "not host:gpu": (
        "    model: m8\n    engine: v11\n    placement: [gpu01]  # <-\n    port: 8000\n",
        "'gpu01' is not host:GPU",
    ),
    "gpu twice in one": (
        "    model: m8\n    engine: v11\n    placement: [gpu01:1, gpu01:1]  # <-\n    port: 8000\n",
        "gpu01:1 is listed twice",
    ),
    "tp mismatch": (
        "    model: m8\n    engine: v11\n    placement: gpu01:[0-3]\n    tp: 2  # <-\n    port: 8000\n",
        "tp is 2 but placement lists 4 GPU(s)",
    ),
    "heads not divisible": (
        "    model: m8\n    engine: v11\n    placement: gpu01:[0-2]\n    port: 8000\n",
        "32 attention heads, not divisible by TP 3",
    ),
    "env not string": (
        "    model: m8\n    engine: v11\n    placement: [gpu01:0]\n    port: 8000\n    env:\n      NCCL_DEBUG: 1  # <-\n",
        "env.NCCL_DEBUG: environment values must be strings; quote the value",
    ),
    "args sets port": (
        "    model: m8\n    engine: v11\n    placement: [gpu01:0]\n    port: 8000\n    args:\n      --port: 9000  # <-\n",
        "'--port' is set by clusterctl",
    ),
    "bad port": (
        "    model: m8\n    engine: v11\n    placement: [gpu01:0]\n    port: 99999  # <-\n",
        "out of range 1-65535",
    ),
    "missing placement": ("    model: m8\n    engine: v11\n    port: 8000\n", "missing 'placement'"),
    "bad role": (
        "    model: m8\n    engine: v11\n    placement: [gpu01:0]\n    port: 8000\n    role: both  # <-\n",
        "'both' is not one of mixed, prefill, decode",
    ),
    "unknown key": (
        "    model: m8\n    engine: v11\n    placement: [gpu01:0]\n    port: 8000\n    replicas: 2  # <-\n",
        "unknown key 'replicas'",
    ),
}


def _expected_line(text: str) -> int:
    for i, line in enumerate(text.splitlines(), 1):
        if "# <-" in line:
            return i
    raise AssertionError("no marker")


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_error_at_its_line(case: str) -> None:
    text, fragment = ERRORS[case]
    found = problems_of(text)
    expected = _expected_line(text)
    assert any(line == expected and fragment in msg for line, msg in found), found
    assert any(msg.startswith(f"inv.yaml:{expected}: ") for _, msg in found)


@pytest.mark.parametrize("case", sorted(INSTANCE_ERRORS))
def test_instance_error_at_its_line(case: str) -> None:
    body, fragment = INSTANCE_ERRORS[case]
    text = BASE + "instances:\n  inst:  # <-\n" + body
    # the instance's own line unless the body marks a more precise one
    expected = (
        _expected_line(text.replace("  inst:  # <-", "  inst:", 1)) if body.count("# <-") else _expected_line(text)
    )
    found = problems_of(text)
    assert any(line == expected and fragment in msg for line, msg in found), (expected, found)


def test_two_instances_on_one_gpu_and_one_port() -> None:
    text = BASE + textwrap.dedent("""\
        instances:
          a:
            model: m8
            engine: v11
            placement: gpu01:[0-1]
            port: 8000
          b:
            model: m8
            engine: v11
            placement: gpu01:[1-2]
            port: 8000
          c:
            model: m8
            engine: v11
            placement: [gpu02:1]
            port: 8000
        """)
    found = problems_of(text)
    b_line = text.splitlines().index("  b:") + 1
    assert (
        b_line,
        f"inv.yaml:{b_line}: instances.b: GPU gpu01:1 is also used by instance a (line {b_line - 5})",
    ) in found
    assert (
        b_line,
        f"inv.yaml:{b_line}: instances.b: port 8000 on gpu01 is also used by instance a (line {b_line - 5})",
    ) in found
    assert len(found) == 2  # c: same port on another host is fine


PCIE = """\
version: 1
defaults:
  gpus: {count: 4, model: L40S, interconnect: pcie}
hosts: {p1: {}}
engines: {v: {path: /v, version: "1"}}
models: {m: {path: /m}}
instances:
  big:
    model: m
    engine: v
    placement: p1:[0-3]
    port: 8000
"""


def test_tp_above_two_on_pcie_needs_force() -> None:
    with pytest.raises(InventoryError) as e:
        load(PCIE)
    (p,) = e.value.problems
    assert p.severity == "warning" and p.line == 8
    assert "TP 4 on PCIe-only host p1" in str(p) and "use --force" in str(p)
    inv = load(PCIE, force=True)
    assert inv.instances["big"].tp_size == 4
    assert len(inv.warnings) == 1 and "inv.yaml:8: warning: " in inv.warnings[0]


def test_force_does_not_hide_errors() -> None:
    with pytest.raises(InventoryError) as e:
        load(PCIE + "    tp: 3\n", force=True)
    assert sorted((p.severity, p.line) for p in e.value.problems) == [("error", 13), ("warning", 8)]


TEMPLATE = (
    BASE
    + """\
groups:
  pool: {hosts: 'gpu[01-02]'}
templates:
  t:
    model: m8
    engine: v11
    replicas: %s
    tp: 4
    hosts: %s
"""
)


def test_template_hosts_pattern_must_match() -> None:
    line = TEMPLATE.splitlines().index("    hosts: %s") + 1
    found = problems_of(TEMPLATE % (2, "'@pool&gpu04'"))
    assert (line, f"inv.yaml:{line}: templates.t.hosts: '@pool&gpu04' matches no host") in found
    found = problems_of(TEMPLATE % (2, "'@pol'"))
    assert any(ln == line and "unknown group @pol" in msg for ln, msg in found)


def test_template_capacity() -> None:
    inv = load(TEMPLATE % (4, "'@pool'"))
    assert inv.templates["t"].replicas == 4 and inv.templates["t"].hosts == "@pool"
    found = problems_of(TEMPLATE % (5, "'@pool'"))
    assert any("5 replicas of TP 4 do not fit: '@pool' has room for 4" in msg for _, msg in found)


def test_broken_fixture_reports_every_problem() -> None:
    path = FIXTURES / "broken.yaml"
    with pytest.raises(InventoryError) as e:
        load_inventory(path)
    got = {(p.line, p.message.split(":")[0]) for p in e.value.problems}
    lines = [p.line for p in e.value.problems]
    assert lines == sorted(lines)
    expected_lines = {5, 8, 11, 15, 16, 17, 19, 20, 24, 31, 33, 40, 41, 45, 47, 51, 52, 59}
    assert {line for line, _ in got} == expected_lines
    text = str(e.value)
    for fragment in (
        "broken.yaml:5: defaults.ssh: unknown key 'prot'",
        "broken.yaml:41: instances.c: GPU gpu05:1 is also used by instance b",
        "broken.yaml:41: instances.c: port 8000 on gpu05 is also used by instance b",
        "broken.yaml:45: instances.c: tp is 2 but placement lists 3 GPU(s)",
        "broken.yaml:41: warning: instances.c: TP 3 on PCIe-only host gpu05",
        "broken.yaml:59: templates.pool.hosts: unknown group @rack7",
    ):
        assert fragment in text
