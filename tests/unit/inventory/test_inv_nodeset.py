"""Node sets: expand/fold in ClusterShell notation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterctl.errors import ClusterctlError, SelectionError
from clusterctl.inventory.nodeset import NodeSetError, expand, fold, natural_key

CASES = [
    # pattern, expanded names, canonical fold
    ("gpu01", ["gpu01"], "gpu01"),
    ("gpu[001-004,007]", ["gpu001", "gpu002", "gpu003", "gpu004", "gpu007"], "gpu[001-004,007]"),
    ("gpu[1-3]", ["gpu1", "gpu2", "gpu3"], "gpu[1-3]"),
    ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"], "gpu[08-11]"),
    ("gpu[9-11]", ["gpu9", "gpu10", "gpu11"], "gpu[9-11]"),
    ("r[1-2]n[01-03]", ["r1n01", "r1n02", "r1n03", "r2n01", "r2n02", "r2n03"], "r[1-2]n[01-03]"),
    ("10.0.0.[11-14]", ["10.0.0.11", "10.0.0.12", "10.0.0.13", "10.0.0.14"], "10.0.0.[11-14]"),
    ("n[1-7/3]", ["n1", "n4", "n7"], "n[1,4,7]"),
    ("a,b[1-2]", ["a", "b1", "b2"], "a,b[1-2]"),
    ("gpu[1-2]-ib", ["gpu1-ib", "gpu2-ib"], "gpu[1-2]-ib"),
    ("gpu01:[0-3]", ["gpu01:0", "gpu01:1", "gpu01:2", "gpu01:3"], "gpu01:[0-3]"),
    ("n[1,01]", ["n1", "n01"], "n[1,01]"),
    ("node[0-1]", ["node0", "node1"], "node[0-1]"),
]


@pytest.mark.parametrize("pattern,names,folded", CASES)
def test_expand(pattern: str, names: list[str], folded: str) -> None:
    assert expand(pattern) == names


@pytest.mark.parametrize("pattern,names,folded", CASES)
def test_fold_is_canonical(pattern: str, names: list[str], folded: str) -> None:
    assert fold(names) == folded
    assert fold(reversed(names)) == folded
    assert expand(folded) == names


def test_fold_groups_by_prefix_suffix_and_padding() -> None:
    names = ["gpu1", "gpu2", "gpu01", "cpu3", "gpu02", "x"]
    assert fold(names) == "cpu3,gpu[1-2,01-02],x"
    assert fold(["r1n1", "r1n2", "r2n1", "r2n2", "r3n1"]) == "r[1-2]n[1-2],r3n1"


def test_expand_unsorted_keeps_pattern_order_and_duplicates() -> None:
    assert expand("gpu[3,1,3]", sort=False) == ["gpu3", "gpu1", "gpu3"]
    assert expand("gpu[3,1,3]") == ["gpu1", "gpu3"]


@pytest.mark.parametrize(
    "pattern,fragment",
    [
        ("gpu[1-", "never closed"),
        ("gpu]", "without '['"),
        ("gpu[[1]]", "nested"),
        ("gpu[3-1]", "backwards"),
        ("gpu[a-b]", "bad range item"),
        ("gpu[]", "bad range item"),
        ("gpu[1-4/0]", "step"),
        ("", "empty name"),
        ("a,,b", "empty name"),
        ("gpu 01", "whitespace"),
        ("n[1-1000000]", "more than"),
    ],
)
def test_expand_errors_are_clear(pattern: str, fragment: str) -> None:
    with pytest.raises(NodeSetError) as e:
        expand(pattern)
    assert fragment in str(e.value)
    assert isinstance(e.value, SelectionError) and isinstance(e.value, ValueError)
    assert isinstance(e.value, ClusterctlError)


@pytest.mark.parametrize("bad", ["a[1]", "a,b", "with space", ""])
def test_fold_rejects_names_that_cannot_round_trip(bad: str) -> None:
    with pytest.raises(NodeSetError):
        fold([bad])


def test_natural_order() -> None:
    assert sorted(["gpu10", "gpu9", "gpu1"], key=natural_key) == ["gpu1", "gpu9", "gpu10"]


# Host-name-like strings: letters, digits, '.', '-', ':' (placement pairs).
_names = st.from_regex(r"[a-z]{0,3}[0-9]{0,3}([.:-]?[a-z]{0,2}[0-9]{0,4}){0,2}", fullmatch=True).filter(bool)


@settings(max_examples=300, deadline=None)
@given(st.sets(_names, max_size=40))
def test_expand_of_fold_is_the_sorted_set(names: set[str]) -> None:
    if not names:
        return
    assert expand(fold(names)) == sorted(names, key=natural_key)


@settings(max_examples=300, deadline=None)
@given(st.sets(_names, min_size=1, max_size=40))
def test_fold_of_expand_is_stable(names: set[str]) -> None:
    folded = fold(names)
    assert fold(expand(folded)) == folded


_ranges = st.tuples(st.integers(0, 120), st.integers(0, 30), st.integers(1, 4), st.booleans())


@settings(max_examples=200, deadline=None)
@given(st.lists(_ranges, min_size=1, max_size=4), st.sampled_from(["gpu", "n", "10.0.0."]))
def test_expand_of_generated_patterns(items: list[tuple[int, int, int, bool]], prefix: str) -> None:
    body = ",".join(
        f"{str(lo).zfill(3) if pad else lo}-{str(lo + span).zfill(3) if pad else lo + span}"
        for lo, span, _s, pad in items
    )
    names = expand(f"{prefix}[{body}]")
    assert names == sorted(set(names), key=natural_key)
    assert fold(expand(fold(names))) == fold(names)
