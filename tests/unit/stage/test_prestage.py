"""Pre-staging a release: the next version staged and warmed (within a page-cache budget)
while the model path keeps pointing at the version in use; the release then only switches."""

from __future__ import annotations

import os

from clusterctl.node.stage import verify_model

from unit.stage.nodehelp import CHUNK, make_model, manifest_for, run_node, stage_job
from unit.stage.rangeserver import RangeServer

SIZES = {
    "config.json": 700,
    "model-00001-of-00002.safetensors": 12 * CHUNK,
    "model-00002-of-00002.safetensors": 9 * CHUNK,
}


def test_prestage_warms_within_the_budget_and_the_release_only_switches(tmp_path):
    v1 = make_model(tmp_path / "v1", SIZES, seed=1)
    v2 = make_model(tmp_path / "v2", SIZES, seed=2)
    m1, m2 = manifest_for(v1, version="v1"), manifest_for(v2, version="v2")
    target = tmp_path / "models" / "m"
    with RangeServer(str(v1)) as srv:
        rc, res = run_node(stage_job(m1, target, {"kind": "http", "url": srv.url}))
    assert rc == 0 and res["ok"], res
    budget = 700 + 5 * CHUNK
    with RangeServer(str(v2)) as srv:
        rc, pre = run_node(
            stage_job(m2, target, {"kind": "http", "url": srv.url}, switch=False, warm=True, warm_budget=budget)
        )
        assert rc == 0 and pre["ok"], pre
        assert pre["bytes"] == m2.total_bytes and "switched_from" not in pre
        assert pre["warm"]["read_bytes"] == budget and pre["warm"]["left_cold"] == m2.total_bytes - budget
        # The version in use is untouched and still passes the unit's ExecStartPre check.
        assert os.readlink(target) == ".versions/m/v1" and verify_model.check(str(target)) is None
        served = len(srv.requests)
        # In the release window: nothing is fetched again, the path switches.
        rc, rel = run_node(stage_job(m2, target, {"kind": "http", "url": srv.url}))
        assert rc == 0 and rel["ok"] and rel["already_present"] and rel["bytes"] == 0, rel
        assert len(srv.requests) == served
    assert os.readlink(target) == ".versions/m/v2" and rel["switched_from"] == "v1"
    assert verify_model.check(str(target)) is None
    assert (target / "model-00002-of-00002.safetensors").read_bytes() == (
        v2 / "model-00002-of-00002.safetensors"
    ).read_bytes()
