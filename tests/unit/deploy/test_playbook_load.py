"""Loading playbooks: what a valid one means, and every error at its line, all at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterctl.deploy.playbooks.load import PlaybookError, load_playbook, parse_playbook

REPO = Path(__file__).resolve().parents[3]

GOOD = """\
name: upgrade
steps:
  - {name: check, kind: exec, command: 'test -x /opt/vllm-0.33/bin/vllm', expect_rc: 0, hosts: 'gpu[01-02]'}
  - {kind: preflight}
  - name: canary
    kind: canary
    instances: 'qwen-*'
  - name: rest
    kind: rollout
    serial: [1, 25%, 100%]
    max_fail_percentage: 10
    gate_timeout: 900
    gates:
      - http: {path: /v1/models, expect_status: 200, contains: qwen}
      - metric: {name: "vllm:num_requests_waiting", max: 0}
        timeout: 60
      - exec: {command: 'systemctl is-active "clusterctl-$INSTANCE.service"'}
      - drift: {baseline: v1, calibration: false}
      - bench: {reference: old-1, tolerance: 0.05, concurrency: [1, 4], requests: 8}
        timeout: 120
"""


def test_a_valid_playbook_reads_as_written() -> None:
    book = parse_playbook(GOOD, "pb.yaml")
    assert book.name == "upgrade"
    assert [(s.name, s.kind, s.line) for s in book.steps] == [
        ("check", "exec", 3),
        ("preflight", "preflight", 4),
        ("canary", "canary", 5),
        ("rest", "rollout", 8),
    ]
    check, _, canary, rest = book.steps
    assert (check.command, check.expect_rc, check.hosts, check.hosts_line) == (
        "test -x /opt/vllm-0.33/bin/vllm",
        0,
        "gpu[01-02]",
        3,
    )
    assert canary.instances == "qwen-*" and canary.serial == []
    assert rest.serial == ["1", "25%", "100%"] and rest.max_fail_percentage == 10 and rest.gate_timeout_s == 900
    http, metric, ex, drift, bench = rest.gates
    assert (drift.baseline, drift.calibration, drift.thresholds) == ("v1", False, None)
    assert (bench.reference, bench.tolerance, bench.concurrency, bench.requests, bench.timeout_s) == (
        "old-1",
        0.05,
        (1, 4),
        8,
        120,
    )
    assert (http.type, http.path, http.expect_status, http.contains, http.timeout_s) == (
        "http",
        "/v1/models",
        200,
        "qwen",
        30.0,
    )
    assert (metric.metric, metric.max, metric.min, metric.timeout_s) == ("vllm:num_requests_waiting", 0, None, 60)
    assert (ex.command, ex.expect_rc) == ('systemctl is-active "clusterctl-$INSTANCE.service"', 0)


@pytest.mark.parametrize("name", ["default.yaml", "rolling-engine-upgrade.yaml"])
def test_the_shipped_playbooks_load(name: str) -> None:
    book = load_playbook(str(REPO / "playbooks" / name))
    assert book.steps


def test_the_shipped_default_is_the_deploy_pipeline() -> None:
    book = load_playbook(str(REPO / "playbooks" / "default.yaml"))
    assert [s.kind for s in book.steps] == ["preflight", "stage", "units", "canary", "rollout", "gates"]
    rollout = book.steps[4]
    assert rollout.serial == ["1", "25%", "100%"] and rollout.max_fail_percentage == 0


# (playbook text, [(line, message fragment), ...]): every problem of the text, by line.
BAD = [
    ("steps: []\n", [(1, "steps: expected a non-empty list of steps")]),
    ("name: x\n", [(1, "'steps' is required")]),
    ("- a\n- b\n", [(1, "playbook: expected a mapping, got a list")]),
    (
        "name: x\nstep:\n  - {kind: units}\n",
        [(1, "'steps' is required"), (2, "unknown key 'step'; did you mean 'steps'?")],
    ),
    (
        "steps:\n  - {kind: rolout}\n",
        [
            (
                2,
                "kind 'rolout' is not one of preflight, stage, units, canary, rollout, "
                "gates, exec; did you mean 'rollout'?",
            )
        ],
    ),
    ("steps:\n  - {name: x}\n", [(2, "steps[1]: 'kind' is required")]),
    ("steps:\n  - kind: rollout\n    seral: 2\n", [(3, "unknown key 'seral'; did you mean 'serial'?")]),
    ("steps:\n  - kind: units\n    serial: 2\n", [(3, "steps[1] (units): unknown key 'serial'")]),
    ("steps:\n  - kind: rollout\n    serial: 1,x\n", [(3, "step 'rollout'.serial: 'x' is not a count")]),
    ("steps:\n  - kind: rollout\n    serial: 150%\n", [(3, "a percentage must be in 1..100")]),
    ("steps:\n  - kind: rollout\n    serial: {a: 1}\n", [(3, "expected a count, a percentage or a ramp")]),
    ("steps:\n  - kind: rollout\n    max_fail_percentage: 101\n", [(3, "max_fail_percentage: 101 is not in 0..100")]),
    ("steps:\n  - kind: rollout\n    max_fail_percentage: lots\n", [(3, "max_fail_percentage: expected a number")]),
    ("steps:\n  - kind: exec\n", [(2, "step 'exec': 'command' is required")]),
    ("steps:\n  - {kind: exec, command: '  '}\n", [(2, "step 'exec'.command: the command is empty")]),
    ("steps:\n  - {kind: exec, command: x, expect_rc: 300}\n", [(2, "expect_rc: 300 is out of range 0-255")]),
    ("steps:\n  - {kind: exec, command: x, timeout: 0}\n", [(2, "timeout: must be greater than 0")]),
    ("steps:\n  - {kind: units}\n  - {kind: units}\n", [(3, "duplicate step name 'units' (first at line 2)")]),
    ("steps:\n  - {kind: rollout}\n  - {kind: canary}\n", [(3, "the canary must come before the rollout (line 2)")]),
    ("steps:\n  - {kind: canary}\n  - {kind: canary, name: c2}\n", [(3, "a second canary (the first is at line 2)")]),
    ("steps:\n  - kind: gates\n    gates: {http: {path: /x}}\n", [(3, "expected a list of gates")]),
    ("steps:\n  - kind: gates\n    gates:\n      - {}\n", [(4, "a gate is exactly one of http, metric, exec")]),
    (
        "steps:\n  - kind: gates\n    gates:\n      - {http: {path: /a}, exec: {command: x}}\n",
        [(4, "a gate is exactly one of http, metric, exec, drift, bench (got http, exec)")],
    ),
    (
        "steps:\n  - kind: gates\n    gates:\n      - http: {path: v1/models}\n",
        [(4, "path: 'v1/models' must start with /")],
    ),
    ("steps:\n  - kind: gates\n    gates:\n      - http: {expect_status: 200}\n", [(4, "'path' is required")]),
    (
        "steps:\n  - kind: gates\n    gates:\n      - http:\n          path: /x\n          expect_stats: 200\n",
        [(6, "unknown key 'expect_stats'; did you mean 'expect_status'?")],
    ),
    (
        "steps:\n  - kind: gates\n    gates:\n      - http: {path: /x, expect_status: 99}\n",
        [(4, "expect_status: 99 is out of range 100-599")],
    ),
    ("steps:\n  - kind: gates\n    gates:\n      - metric: {name: m}\n", [(4, "give 'max', 'min' or both")]),
    ("steps:\n  - kind: gates\n    gates:\n      - metric: {name: m, min: 5, max: 1}\n", [(4, "min 5 is above max 1")]),
    ("steps:\n  - kind: gates\n    gates:\n      - metric: {max: 1}\n", [(4, "'name' is required")]),
    ("steps:\n  - kind: gates\n    gates:\n      - exec: {expect_rc: 1}\n", [(4, "'command' is required")]),
    (
        "steps:\n  - kind: gates\n    gates:\n      - http: {path: /x}\n        timeot: 3\n",
        [(5, "unknown key 'timeot'; did you mean 'timeout'?")],
    ),
    ("steps:\n  - kind: preflight\n    gates: []\n", [(3, "steps[1] (preflight): unknown key 'gates'")]),
    (
        "steps:\n  - kind: units\n  - kind: units\n    bad: 1\n",
        [(3, "duplicate step name 'units'"), (4, "unknown key 'bad'")],
    ),
    ("steps:\n  - {kind: units\n", [(3, "YAML syntax error")]),
    ("steps:\n  - kind: gates\n    gates:\n      - bench: {tolerance: 0.1}\n", [(4, "'reference' is required")]),
    (
        "steps:\n  - kind: gates\n    gates:\n      - bench: {reference: a, tolerance: 10}\n",
        [(4, "tolerance: 10 is a fraction (0.1 = 10 %), below 1")],
    ),
    (
        "steps:\n  - kind: gates\n    gates:\n      - bench: {reference: a, concurrency: [1, 0]}\n",
        [(4, "concurrency: 0 is out of range 1-4096")],
    ),
    (
        "steps:\n  - kind: gates\n    gates:\n      - drift: {baseline: 3, calibration: maybe}\n",
        [(4, "baseline: expected a string"), (4, "calibration: expected true or false")],
    ),
    (
        "steps:\n  - kind: gates\n    gates:\n      - drift: {basline: previous}\n",
        [(4, "unknown key 'basline'; did you mean 'baseline'?")],
    ),
]


@pytest.mark.parametrize("text,expected", BAD, ids=[str(i) for i in range(len(BAD))])
def test_every_error_at_its_line(text: str, expected: list[tuple[int, str]]) -> None:
    with pytest.raises(PlaybookError) as ei:
        parse_playbook(text, "pb.yaml")
    got = [(p.line, p.message) for p in ei.value.problems]
    assert len(got) == len(expected), got
    for (line, msg), (want_line, want) in zip(got, expected):
        assert line == want_line and want in msg, (got, expected)
    assert str(ei.value).startswith(f"pb.yaml:{expected[0][0]}:")


def test_a_missing_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(PlaybookError, match="nope.yaml: cannot read the playbook"):
        load_playbook(str(tmp_path / "nope.yaml"))
