"""``clusterctl stage``: usage and source errors exit 3 with the place named; ``stage manifest``."""

from __future__ import annotations

import json
from pathlib import Path

from clusterctl.cli.main import main
from clusterctl.exitcodes import ExitCode
from clusterctl.node.stage import manifest as mf

from unit.stage.nodehelp import make_model

INV = str(Path(__file__).parents[3] / "inventories" / "example-pcie-small.yaml")


def test_model_without_source_names_the_inventory_entry(capsys):
    assert main(["stage", "qwen3-8b", "-i", INV]) == ExitCode.UNKNOWN
    err = capsys.readouterr().err
    assert "example-pcie-small.yaml: models.qwen3-8b.source" in err and "Traceback" not in err


def test_unknown_model_and_unsupported_source(tmp_path, capsys, monkeypatch):
    assert main(["stage", "nosuch", "-i", INV]) == ExitCode.UNKNOWN
    assert "model 'nosuch' is not in" in capsys.readouterr().err
    assert main(["stage", "qwen3-8b", "-i", INV, "--source", "gs://bucket/x"]) == ExitCode.UNKNOWN
    assert "--source: unsupported source scheme 'gs'" in capsys.readouterr().err
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    assert main(["stage", "qwen3-8b", "-i", INV, "--source", "s3://bucket/x"]) == ExitCode.UNKNOWN
    assert "--source: s3://bucket/x: set AWS_ACCESS_KEY_ID" in capsys.readouterr().err
    assert main(["stage", "qwen3-8b", "-i", INV, "--source", str(tmp_path), "--relay", "star"]) == ExitCode.UNKNOWN
    assert "--relay 'star': expected one of chain, tree, none" in capsys.readouterr().err


def test_manifest_verb_writes_the_manifest_at_the_source(tmp_path, capsys):
    src = make_model(tmp_path / "q", {"a.bin": 70_000})
    assert main(["stage", "manifest", str(src), "--name", "q", "--version", "7", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    written = mf.loads((src / mf.MANIFEST_NAME).read_text())
    assert out["manifest_sha256"] == written.digest() and written.version == "7"
    assert not list(src.glob("*.tmp-*"))
    assert main(["stage", "manifest", str(src)]) == ExitCode.UNKNOWN
    assert "--name NAME" in capsys.readouterr().err


def test_tables_group_identical_hosts_and_name_failures():
    from rich.console import Console

    from clusterctl.cli.stage import _stage_table, _status_rows, _group
    from clusterctl.stage.run import NodeRow, StageReport

    ok = {"version": "v2", "bytes": 10_000_000, "fetch_seconds": 2.0, "upstream": "10.0.0.1:7707"}
    rows = [
        NodeRow("gpu01", "staged", data={"version": "v2", "bytes": 10_000_000, "fetch_seconds": 1.0}),
        NodeRow("gpu02", "staged", data=ok),
        NodeRow("gpu03", "staged", data=dict(ok, fetch_seconds=4.0)),
        NodeRow("gpu04", "failed", "not enough space for q v2 under /models", "disk_space"),
    ]
    console = Console(width=200, record=True)
    console.print(_stage_table(StageReport("q", "v2", "http://s/q/", "chain", 10_000_000, rows, 3.0)))
    text = console.export_text()
    assert "gpu[02-03]  staged  v2       relay   2.5-5.0" in text
    assert "gpu01       staged  v2       source  10.0" in text
    assert "gpu04       failed" in text and "not enough space" in text
    status = [
        NodeRow(
            h,
            "ok",
            data={
                "verify_model_installed": True,
                "models": [
                    {
                        "name": "q",
                        "path": "/models/q",
                        "current": "v2",
                        "partial": [],
                        "versions": [
                            {"version": "v1", "verified": True, "in_use": False},
                            {"version": "v2", "verified": True, "in_use": True},
                        ],
                        "residency": {"resident": 50, "bytes": 100},
                    }
                ],
            },
        )
        for h in ("a1", "a2")
    ]
    status.append(NodeRow("a3", "unreachable", "TCP connect timed out after 3s", "fleet"))
    assert _group(_status_rows(status)) == [
        ("a[1-2]", ("q", "v2", "v1, *v2", "yes", "50%", "")),
        ("a3", ("-", "-", "-", "-", "-", "unreachable: TCP connect timed out after 3s")),
    ]


def test_a_bad_warm_budget_is_a_usage_error(tmp_path, capsys):
    src = make_model(tmp_path / "q", {"a.bin": 70_000})
    assert (
        main(["stage", "qwen3-8b", "-i", INV, "--source", str(src), "--no-switch", "--warm-budget", "lots"])
        == ExitCode.UNKNOWN
    )
    err = capsys.readouterr().err
    assert "--warm-budget: 'lots' is not a size" in err and "Traceback" not in err
