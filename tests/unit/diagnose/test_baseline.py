"""gpu.baseline: learn a known-good configuration, then report what changed."""

from __future__ import annotations

import pytest

from clusterctl.diagnose.baseline import check_baseline, learn, load_baseline, write_baseline
from clusterctl.diagnose.findings import Severity
from clusterctl.errors import ConfigError

import gpu_facts as G


def with_baseline(facts, base):
    c = G.ctx(facts)
    c.thresholds = {**c.thresholds, "baseline": base}
    return c


def test_round_trip_and_unchanged_hosts_are_ok(tmp_path):
    facts = G.healthy()
    path = write_baseline(tmp_path / "base.yaml", learn(facts))
    base = load_baseline(path)
    assert base["hosts"]["gpu01"]["gpu_count"] == 8 and base["hosts"]["gpu01"]["gpus"][3]["nvlink_active"] == 18
    found = check_baseline(with_baseline(G.healthy(), base))
    assert {(f.host, f.severity) for f in found} == {("gpu01", Severity.OK), ("gpu02", Severity.OK)}
    assert not list(tmp_path.glob(".*"))  # no temporary file left


def test_changes_since_the_baseline():
    base = learn(G.healthy())
    now = G.healthy()
    d = now["gpu01"]["gpus"]["devices"]
    d[2]["uuid"] = "GPU-ffffffff-0000-0000-0000-000000000000"
    d[3]["pcie"]["width"] = 8
    for lk in d[4]["nvlink"][:2]:
        lk["state"] = "inactive"
    d[5]["persistence_mode"] = False
    now["gpu01"]["gpus"]["driver_version"] = "535.54.03"
    del now["gpu02"]["gpus"]["devices"][7]
    found = {
        (f.host, f.subject, f.severity, f.message.split(",")[0])
        for f in check_baseline(with_baseline(now, base))
        if f.severity != Severity.OK
    }
    assert found == {
        ("gpu01", "host", Severity.WARN, "driver 535.54.03"),
        (
            "gpu01",
            "gpu:2",
            Severity.WARN,
            "another GPU at this index: GPU-ffffffff-0000-0000-0000-000000000000 "
            "(baseline GPU-00000002-aaaa-bbbb-cccc-dddddddddddd)",
        ),
        ("gpu01", "gpu:3", Severity.WARN, "PCIe x8"),
        ("gpu01", "gpu:4", Severity.CRIT, "16 NVLink links active"),
        ("gpu01", "gpu:5", Severity.WARN, "persistence mode off"),
        ("gpu02", "host", Severity.CRIT, "7 GPUs"),
    }


def test_no_baseline_no_findings_and_bad_files_name_the_place(tmp_path):
    assert check_baseline(G.ctx(G.healthy())) == []
    bad = tmp_path / "b.yaml"
    bad.write_text("hosts:\n  - [\n")
    with pytest.raises(ConfigError, match=r"b.yaml:\d+: not valid YAML"):
        load_baseline(bad)
    bad.write_text("something: else\n")
    with pytest.raises(ConfigError, match=r"b.yaml:1: not a doctor baseline"):
        load_baseline(bad)


def test_cli_learn_refuses_from_and_baseline_flag_is_read(tmp_path, capsys):
    import json

    from clusterctl.cli.main import main
    from clusterctl.diagnose.bundle import Snapshot, write_bundle

    facts = G.healthy()
    base = write_baseline(tmp_path / "base.yaml", learn(facts))
    facts["gpu02"]["gpus"]["devices"][1]["uuid"] = "GPU-new"
    b = write_bundle(Snapshot(facts=facts), tmp_path / "b", G.INVENTORY)
    assert main(["doctor", "--from", str(b), "--learn", str(tmp_path / "x.yaml")]) == 3
    assert "cannot be combined with --from" in capsys.readouterr().err
    assert main(["doctor", "--from", str(b), "--baseline", str(base), "--checks", "baseline", "--json"]) == 1
    rep = json.loads(capsys.readouterr().out)
    assert [(f["host"], f["subject"]) for f in rep["findings"] if f["severity"] == "WARN"] == [("gpu02", "gpu:1")]
