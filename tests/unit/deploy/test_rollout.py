"""Batch planning with Ansible's serial / max_fail_percentage semantics (docs examples)."""

from __future__ import annotations

import pytest

from clusterctl.deploy.rollout.batches import SerialError, batch_failed, batches, parse_serial

HOSTS = [f"h{i:02d}" for i in range(1, 11)]


def sizes(serial: str | None, n: int = 10) -> list[int]:
    return [len(b) for b in batches([f"h{i}" for i in range(n)], parse_serial(serial))]


@pytest.mark.parametrize(
    "serial,n,expected",
    [
        (None, 10, [10]),  # no serial: one batch of every host
        ("3", 10, [3, 3, 3, 1]),  # Ansible docs: serial: 3 -> 3 hosts a batch, the rest last
        ("30%", 10, [3, 3, 3, 1]),  # a percentage of all hosts, rounded down
        ("1,5,10", 20, [1, 5, 10, 4]),  # docs: "serial: [1, 5, 10]"; the last value repeats
        ("10%,20%,100%", 20, [2, 4, 14]),  # docs: "serial: ['10%', '20%', '100%']"
        ("1,25%,100%", 8, [1, 2, 5]),  # the canary ramp
        ("1%", 10, [1] * 10),  # a percentage under one host is one host (pct_to_int min 1)
        ("1,2", 6, [1, 2, 2, 1]),  # the last value repeats until every host has a batch
        ("0", 4, [4]),  # 0: everything at once, as Ansible's serial <= 0
        ("100%", 4, [4]),
    ],
)
def test_batches_follow_ansible(serial: str | None, n: int, expected: list[int]) -> None:
    assert sizes(serial, n) == expected


def test_batches_keep_host_order_and_cover_every_host_once() -> None:
    got = batches(HOSTS, parse_serial("1,25%,100%"))
    assert got[0] == ["h01"]
    assert [h for b in got for h in b] == HOSTS


@pytest.mark.parametrize("text", ["a", "1,,2", "0%", "150%", "-1", "1.5"])
def test_bad_serial_values_are_refused_with_the_value(text: str) -> None:
    with pytest.raises(SerialError, match="--serial"):
        parse_serial(text)


@pytest.mark.parametrize(
    "failed,size,pct,expected",
    [
        (1, 4, 25, False),  # 25 % reached, not exceeded: the batch passes
        (2, 4, 25, True),
        (2, 4, 49, True),  # docs: serial 4, abort when 2 fail -> 49, not 50
        (2, 4, 50, False),
        (1, 1, 0, True),  # default 0: any failure fails the batch
        (0, 5, 0, False),
        (1, 3, 33, True),  # 33.3 % > 33
    ],
)
def test_max_fail_percentage_must_be_exceeded(failed: int, size: int, pct: float, expected: bool) -> None:
    assert batch_failed(failed, size, pct) is expected
