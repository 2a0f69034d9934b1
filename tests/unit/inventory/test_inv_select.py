"""Host selection patterns."""

from __future__ import annotations

import textwrap

import pytest

from clusterctl.errors import SelectionError
from clusterctl.inventory.loader import load_inventory_text
from clusterctl.inventory.select import select_hosts

INV = load_inventory_text(
    textwrap.dedent("""\
    version: 1
    groups:
      rack1: {hosts: 'gpu[01-04]', labels: {rack: r1}}
      rack2: {hosts: 'gpu[05-08]', labels: {rack: r2}}
      canary: {hosts: [gpu02, gpu06]}
      empty: {}
    hosts:
      gpu[08,07,06,05,04,03,02,01]: {}
      cpu1: {labels: {role: head}}
    """),
    "sel.yaml",
)


def names(pattern: str, failed: list[str] | None = None) -> list[str]:
    return [h.name for h in select_hosts(INV, pattern, failed=failed)]


CASES = [
    ("all", ["gpu08", "gpu07", "gpu06", "gpu05", "gpu04", "gpu03", "gpu02", "gpu01", "cpu1"]),
    ("gpu03", ["gpu03"]),
    ("gpu[01-03]", ["gpu03", "gpu02", "gpu01"]),
    ("@rack1", ["gpu04", "gpu03", "gpu02", "gpu01"]),
    ("@rack1&@canary", ["gpu02"]),
    ("@rack1,@canary", ["gpu06", "gpu04", "gpu03", "gpu02", "gpu01"]),
    ("@rack1,!gpu03", ["gpu04", "gpu02", "gpu01"]),
    ("!@rack1", ["gpu08", "gpu07", "gpu06", "gpu05", "cpu1"]),
    ("rack=r2", ["gpu08", "gpu07", "gpu06", "gpu05"]),
    ("rack=r2&!@canary", ["gpu08", "gpu07", "gpu05"]),
    ("role=head,gpu01", ["gpu01", "cpu1"]),
    ("gpu0*", ["gpu08", "gpu07", "gpu06", "gpu05", "gpu04", "gpu03", "gpu02", "gpu01"]),
    ("@empty", []),
    ("@all&!cpu1&!@rack2", ["gpu04", "gpu03", "gpu02", "gpu01"]),
    (" @rack1 & @canary , cpu1 ", ["gpu02", "cpu1"]),
]


@pytest.mark.parametrize("pattern,expected", CASES)
def test_patterns(pattern: str, expected: list[str]) -> None:
    assert names(pattern) == expected


def test_failed_uses_the_given_set() -> None:
    assert names("@failed", failed=["gpu05", "gpu01", "gone99"]) == ["gpu05", "gpu01"]
    assert names("@failed&@rack1", failed=["gpu05", "gpu01"]) == ["gpu01"]
    assert names("@failed", failed=[]) == []


@pytest.mark.parametrize(
    "pattern,fragment",
    [
        ("@failed", "no previous run is recorded"),
        ("@rack9", "unknown group @rack9"),
        ("gpu[07-12]", "unknown host(s): gpu[09-12]"),
        ("zzz", "unknown host(s): zzz"),
        ("rack=r9", "no host has label rack=r9 (rack values: r1, r2)"),
        ("colour=red", "no host has a label 'colour'"),
        ("nope*", "matches no host"),
        ("", "empty host pattern"),
        ("gpu01,,gpu02", "empty item"),
        ("@rack1&", "empty name"),
        ("gpu[01", "never closed"),
    ],
)
def test_errors_name_the_problem(pattern: str, fragment: str) -> None:
    with pytest.raises(SelectionError) as e:
        select_hosts(INV, pattern)
    assert fragment in str(e.value)
