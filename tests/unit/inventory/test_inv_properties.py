"""Property-based: no input makes the loader fail with anything but InventoryError."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import example, HealthCheck, given, settings
from hypothesis import strategies as st

from clusterctl.errors import InventoryError
from clusterctl.inventory.loader import TOP_KEYS, load_inventory_text
from clusterctl.inventory.model import Inventory

KEYS = list(TOP_KEYS) + [
    "ssh",
    "vars",
    "labels",
    "gpus",
    "nics",
    "hosts",
    "address",
    "groups",
    "count",
    "interconnect",
    "netdev",
    "role",
    "model",
    "engine",
    "placement",
    "port",
    "tp",
    "args",
    "env",
    "replicas",
    "port_base",
    "path",
    "arch",
    "attention_heads",
    "kv_heads",
    "user",
    "become",
    "use_ssh_config",
    "<<",
    "gpu[01-03]",
    "gpu01",
    "gpu01:0",
    "@g",
    "n[1-2]",
    "10.0.0.[1-2]",
    "all",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 70000),
    st.floats(allow_nan=True),
    st.sampled_from(
        [
            "gpu01",
            "gpu[01-03]",
            "gpu01:[0-3]",
            "10.0.0.[1-3]",
            "nvlink",
            "pcie",
            "@g",
            "n[3-1]",
            "x:y",
            "",
            "[",
            "~/k",
            "0.10",
            "mixed",
            "8.19e9",
        ]
    ),
    st.text(max_size=8),
)
structures = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=5)), children, max_size=5),
    ),
    max_leaves=30,
)


def _load(text: str) -> None:
    try:
        result = load_inventory_text(text, "prop.yaml")
    except InventoryError as e:
        assert e.problems, "an InventoryError always carries its problems"
        for p in e.problems:
            assert p.file == "prop.yaml" and p.line >= 0 and p.message
        return
    assert isinstance(result, Inventory)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.sampled_from(list("version: 1\n{}[]-,&*!|>'\"#%@`gpu01hosts\t ")), max_size=120))
def test_yamlish_text_never_tracebacks(text: str) -> None:
    _load(text)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_never_tracebacks(text: str) -> None:
    _load(text)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(KEYS), structures, max_size=6))
def test_arbitrary_structures_never_traceback(doc: dict[str, Any]) -> None:
    try:
        text = yaml.safe_dump(doc)
    except yaml.YAMLError:
        return
    _load("version: 1\n" + text if "version" not in doc else text)


section = st.dictionaries(st.sampled_from(["gpu01", "gpu[01-03]", "g", "m", "e", "i"]), structures, max_size=3)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.fixed_dictionaries({}, optional={k: section for k in TOP_KEYS if k != "version"}))
def test_structures_shaped_like_inventories_never_traceback(doc: dict[str, Any]) -> None:
    _load("version: 1\n" + yaml.safe_dump(doc))


EXAMPLE = yaml.safe_load(
    (Path(__file__).resolve().parents[3] / "inventories" / "example-16xh100-roce.yaml").read_text()
)


def _paths(node: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out.extend(_paths(v, prefix + (k,)))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(_paths(v, prefix + (i,)))
    return out


PATHS = _paths(EXAMPLE)[1:]


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(PATHS), structures), min_size=1, max_size=3))
def test_mutated_example_never_tracebacks(mutations: list[tuple[tuple, Any]]) -> None:
    doc = copy.deepcopy(EXAMPLE)
    for path, value in mutations:
        node = doc
        try:
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue
    _load(yaml.safe_dump(doc))


def test_alias_bomb_is_a_problem() -> None:
    lines = ["version: 1", "a: &a [x, x, x, x, x, x, x, x, x, x]"]
    prev = "a"
    for i in range(8):
        lines.append(
            f"l{i}: &l{i} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]"
        )
        prev = f"l{i}"
    try:
        load_inventory_text("\n".join(lines) + "\n", "bomb.yaml")
    except InventoryError as e:
        assert "expands to more than" in str(e)
    else:
        raise AssertionError("an alias bomb must be refused")


def test_recursive_alias_is_a_problem() -> None:
    try:
        load_inventory_text("version: 1\ndefaults: &d\n  vars: *d\n", "rec.yaml")
    except InventoryError as e:
        assert "rec.yaml:2: recursive alias" in str(e)
    else:
        raise AssertionError("a recursive alias must be refused")


_SEL_INV = load_inventory_text(
    "version: 1\ngroups: {g: {hosts: 'gpu[01-02]', labels: {rack: r1}}}\nhosts: {'gpu[01-04]': {}}\n", "s.yaml"
)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("gpu01234[]-,&!@=*?g rackall/:failed")), max_size=30))
def test_selection_patterns_never_traceback(pattern: str) -> None:
    from clusterctl.errors import SelectionError
    from clusterctl.inventory.select import select_hosts

    try:
        hosts = select_hosts(_SEL_INV, pattern, failed=["gpu03"])
    except SelectionError:
        return
    assert all(h.name in _SEL_INV.hosts for h in hosts)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            list("[]:=ab01 \n#;-_.'\"{},\t")
            + [
                "[g]\n",
                "[g:vars]\n",
                "[g:children]\n",
                "ansible_port=",
                "ansible_host=",
                "h[1:3]",
                "all:\n  hosts:\n",
                "  children:\n",
                "    h1:\n",
                "ansible_password=x",
            ]
        ),
        max_size=40,
    ).map("".join)
)
@example(text="0b_")  # PyYAML's int constructor raises ValueError on it
def test_ansible_import_never_tracebacks(tmp_path_factory, text: str) -> None:
    from clusterctl.errors import ConfigError
    from clusterctl.inventory.ansible import import_ansible, to_yaml

    f = tmp_path_factory.mktemp("ans") / "hosts"
    f.write_text(text)
    try:
        result = import_ansible(f)
    except ConfigError as e:
        assert e.problems
        return
    try:
        load_inventory_text(to_yaml(result.data), "conv.yaml")
    except InventoryError as e:
        assert e.problems
