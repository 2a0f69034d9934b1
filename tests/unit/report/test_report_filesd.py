"""The Prometheus file_sd list: every instance, valid per Prometheus' file_sd rules."""

from __future__ import annotations

import json
import re
from pathlib import Path

from clusterctl.cli.main import main
from clusterctl.inventory.loader import load_inventory
from clusterctl.report.filesd import _hostport, targets

EXAMPLE = Path(__file__).resolve().parents[3] / "inventories" / "example-16xh100-roce.yaml"
LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
TARGET = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+):\d{1,5}$")


def check_file_sd(doc: object) -> None:
    """What Prometheus' file_sd loader requires of a JSON target file."""
    assert isinstance(doc, list)
    for tg in doc:
        assert set(tg) <= {"targets", "labels"}
        assert all(isinstance(t, str) and TARGET.match(t) for t in tg["targets"]), tg
        for k, v in tg.get("labels", {}).items():
            assert LABEL_NAME.match(k) and not k.startswith("__") and isinstance(v, str), (k, v)


def test_every_instance_of_the_example_is_a_target_on_its_first_host(tmp_path: Path, capsys):
    inv = load_inventory(EXAMPLE)
    groups = targets(inv)
    check_file_sd(groups)
    assert [g["labels"]["vllm_instance"] for g in groups] == list(inv.instances)
    for g in groups:
        inst = inv.instances[g["labels"]["vllm_instance"]]
        assert g["targets"] == [f"{inv.hosts[inst.placement[0].host].address}:{inst.port}"]
    out = tmp_path / "sd" / "vllm.json"
    assert main(["report", "file-sd", "-i", str(EXAMPLE), "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == groups


def test_ipv6_is_bracketed_and_names_are_not():
    assert _hostport("fd00::11", 8000) == "[fd00::11]:8000"
    assert _hostport("gpu01.example", 8000) == "gpu01.example:8000"


def test_a_bad_inventory_exits_3_naming_the_file(tmp_path: Path, capsys):
    bad = tmp_path / "inv.yaml"
    bad.write_text("hosts: [\n")
    assert main(["report", "file-sd", "-i", str(bad)]) == 3
    assert str(bad) in capsys.readouterr().err
