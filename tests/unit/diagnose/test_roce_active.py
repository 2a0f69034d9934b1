"""doctor --active: without perftest each host is UNKNOWN, with the reason."""

from __future__ import annotations

from clusterctl.diagnose.active import active_findings
from clusterctl.diagnose.findings import Severity, exit_code


def test_each_host_says_why_no_bandwidth_was_measured():
    facts = {"a": {"tools": {"ib_write_bw": None}}, "b": {"tools": {"ib_write_bw": "/usr/bin/ib_write_bw"}},
             "c": {}}
    fs = active_findings(facts, {"d": "unreachable: timed out"})
    assert [(f.host, f.severity) for f in fs] == [(h, Severity.UNKNOWN) for h in "abcd"]
    assert "ib_write_bw (perftest) is not installed" in fs[0].message
    assert "found at /usr/bin/ib_write_bw" in fs[1].message and "does not run" in fs[1].message
    assert "older collector" in fs[2].message and "no facts: unreachable" in fs[3].message
    assert exit_code(fs) == 3


def test_a_bundle_cannot_be_tested_actively():
    fs = active_findings({"a": {"tools": {"ib_write_bw": "/usr/bin/ib_write_bw"}}}, {}, live=False)
    assert [f.message for f in fs] == ["no active test on a bundle"]
