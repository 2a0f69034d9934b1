"""``clusterctl stage``: usage and source errors exit 3 with the place named; ``stage manifest``."""

from __future__ import annotations

import json
from pathlib import Path

from clusterctl.cli.main import main
from clusterctl.exitcodes import ExitCode
from clusterctl.stage import manifest as mf

from unit.stage.nodehelp import make_model

INV = str(Path(__file__).parents[3] / "inventories" / "example-pcie-small.yaml")


def test_model_without_source_names_the_inventory_entry(capsys):
    assert main(["stage", "qwen3-8b", "-i", INV]) == ExitCode.UNKNOWN
    err = capsys.readouterr().err
    assert "example-pcie-small.yaml: models.qwen3-8b.source" in err and "Traceback" not in err


def test_unknown_model_and_unsupported_source(tmp_path, capsys):
    assert main(["stage", "nosuch", "-i", INV]) == ExitCode.UNKNOWN
    assert "model 'nosuch' is not in" in capsys.readouterr().err
    assert main(["stage", "qwen3-8b", "-i", INV, "--source", "s3://bucket/x"]) == ExitCode.UNKNOWN
    assert "--source: unsupported source scheme 's3'" in capsys.readouterr().err
    assert main(["stage", "qwen3-8b", "-i", INV, "--source", str(tmp_path), "--relay", "tree"]) == ExitCode.UNKNOWN
    assert "tree is not implemented" in capsys.readouterr().err


def test_manifest_verb_writes_the_manifest_at_the_source(tmp_path, capsys):
    src = make_model(tmp_path / "q", {"a.bin": 70_000})
    assert main(["stage", "manifest", str(src), "--name", "q", "--version", "7", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    written = mf.loads((src / mf.MANIFEST_NAME).read_text())
    assert out["manifest_sha256"] == written.digest() and written.version == "7"
    assert not list(src.glob("*.tmp-*"))
    assert main(["stage", "manifest", str(src)]) == ExitCode.UNKNOWN
    assert "--name NAME" in capsys.readouterr().err
