"""new / ongoing / resolved / escalated against the previous run."""

from __future__ import annotations

from dataclasses import replace

from clusterctl.diagnose.findings import Severity
from clusterctl.report.diff import diff

from report_findings import crit, ok, warn


def test_first_run_every_problem_is_new_and_ok_rows_are_not_problems():
    d = diff(None, [crit(), warn(), ok()])
    assert [f.check for f in d.new] == ["gpu.xid", "roce.pfc"]  # worst first
    assert not d.ongoing and not d.resolved and d.changed


def test_same_problem_again_is_ongoing_and_not_a_change():
    d = diff([crit(), ok()], [crit(), ok()])
    assert d.ongoing == [crit()] and not d.new and not d.resolved
    assert not d.changed


def test_gone_problem_is_resolved_and_a_host_turning_ok_resolves_it():
    d = diff([crit(), warn()], [warn(), replace(crit(), severity=Severity.OK)])
    assert d.resolved == [crit()] and d.ongoing == [warn()] and d.changed


def test_warn_becoming_crit_is_ongoing_and_escalated_and_a_change():
    w = warn()
    d = diff([w], [replace(w, severity=Severity.CRIT, message="paused 40%")])
    assert len(d.ongoing) == 1 and len(d.escalated) == 1 and d.changed
    d2 = diff([replace(w, severity=Severity.CRIT)], [w])
    assert not d2.escalated and not d2.changed  # better is not a change worth paging


def test_identity_is_check_host_subject_so_another_gpu_is_new():
    d = diff([crit(subject="gpu:3")], [crit(subject="gpu:4")])
    assert [f.subject for f in d.new] == ["gpu:4"] and [f.subject for f in d.resolved] == ["gpu:3"]
