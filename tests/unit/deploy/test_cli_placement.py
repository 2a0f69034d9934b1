"""cordon, uncordon, cordons, scale and placement show, end to end through the CLI (no hosts)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from clusterctl.cli.main import main

INVENTORY = """\
version: 1
defaults:
  gpus: {count: 8, model: H100, memory_gib: 80, interconnect: nvlink}
hosts:
  gpu[01-04]:
    address: 10.0.0.[1-4]
engines:
  vllm: {path: /opt/vllm/bin/vllm, version: "0.11.0"}
models:
  m: {path: /models/m}
instances:
  solo: {model: m, engine: vllm, placement: "gpu01:[6-7]", port: 9000}
templates:
  pool: {model: m, engine: vllm, replicas: 8, tp: 2, hosts: "gpu[01-04]", port_base: 8000}
"""


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY)
    monkeypatch.setenv("CLUSTERCTL_INVENTORY", str(inv))
    monkeypatch.setenv("CLUSTERCTL_SSH_CONFIG", "none")
    monkeypatch.setenv("CLUSTERCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "state"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize(
    "target, message",
    [
        ("gpu9", "host 'gpu9' is not in the inventory"),
        ("gpu02:8", "gpu02 has GPUs 0-7"),
        ("gpu02:x", "'x' is not a GPU index"),
    ],
)
def test_cordon_of_an_unknown_host_or_gpu_exits_3_naming_it(
    env: Path, capsys: pytest.CaptureFixture[str], target: str, message: str
) -> None:
    rc, _, err = run(capsys, "cordon", target, "--reason", "x")
    assert rc == 3 and message in err and "Traceback" not in err
    assert not (env / "cordons.json").exists()


def test_cordon_list_and_uncordon(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "cordon", "gpu02:3", "--reason", "XID 79")[0] == 0
    assert run(capsys, "cordon", "gpu03", "--reason", "maintenance")[0] == 0
    rc, out, _ = run(capsys, "cordons", "--json")
    rows = json.loads(out)
    assert rc == 0 and [r["target"] for r in rows] == ["gpu02:3", "gpu03"]
    assert rows[0]["reason"] == "XID 79" and rows[0]["who"].endswith(f"@{socket.gethostname()}")
    rc, out, _ = run(capsys, "uncordon", "gpu02:3")
    assert rc == 0 and "uncordoned gpu02:3" in out
    rc, out, _ = run(capsys, "cordons")
    assert "gpu03" in out and "gpu02:3" not in out


def test_placement_show_lists_explicit_and_template_instances(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "cordon", "gpu04", "--reason", "bad fan")[0] == 0
    rc, out, _ = run(capsys, "placement", "show", "--json")
    rows = {r["replica"]: r for r in json.loads(out)}
    assert rc == 0 and rows["solo"]["template"] is None and rows["solo"]["gpus"] == [6, 7]
    assert len([r for r in rows.values() if r["template"] == "pool"]) == 8
    assert all(r["host"] != "gpu04" for r in rows.values())
    rc, out, _ = run(capsys, "placement", "show")
    assert rc == 0 and "pool-8" in out and "pending" in out


def test_scale_plan_records_nothing_and_scale_records_the_override(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = run(capsys, "scale", "pool", "--replicas", "10", "--plan", "--json")
    doc = json.loads(out)
    assert rc == 0 and (doc["before"], doc["after"], doc["recorded"]) == (8, 10, False)
    assert not (env / "replicas.json").exists()
    rc, out, _ = run(capsys, "scale", "pool", "--replicas", "3", "--record-only")
    assert rc == 0 and "pool: 8 -> 3" in out and "clusterctl deploy --instances 'pool-*'" in out
    assert json.loads((env / "replicas.json").read_text())["replicas"] == {"pool": 3}
    rc, out, _ = run(capsys, "scale", "pool", "--reset", "--record-only")
    assert rc == 0 and json.loads((env / "replicas.json").read_text())["replicas"] == {}


def test_scale_that_cannot_fit_is_refused_and_records_nothing(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(capsys, "scale", "pool", "--replicas", "16")
    assert rc == 3 and "pool-16" in out and "cannot be placed" in err
    assert not (env / "replicas.json").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["scale", "pol", "--replicas", "2"], "template 'pol' is not in the inventory"),
        (["scale", "pool"], "give either --replicas N or --reset"),
        (["scale", "pool", "--replicas", "-1"], "--replicas"),
    ],
)
def test_scale_usage_errors_exit_3(
    env: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    rc, _, err = run(capsys, *args)
    assert rc == 3 and message in err


def test_a_corrupt_state_file_is_named_without_a_traceback(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    env.mkdir()
    (env / "cordons.json").write_text("{not json")
    rc, _, err = run(capsys, "cordons")
    assert rc == 3 and f"{env / 'cordons.json'}:1: not valid JSON" in err and "Traceback" not in err


class FakeDeploy:
    """Stands in for the deploy engine: records what scale asked for."""

    calls: list[dict[str, object]] = []

    def __init__(
        self,
        inv: object,
        hosts: list,
        make: object,
        state_dir: str,
        opts: object,
        on_event: object = None,
        **kw: object,
    ) -> None:
        FakeDeploy.calls.append({"hosts": [h.name for h in hosts], "state_dir": state_dir, "opts": opts})

    def run(self) -> object:
        from clusterctl.deploy.rollout.engine import DeployReport
        from clusterctl.deploy.rollout.plan import Plan

        return DeployReport("run-1", Plan([]), "ok")


def test_scale_records_then_rolls_out_the_templates_replicas_through_the_deploy_engine(
    env: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from clusterctl.deploy.rollout import engine

    from clusterctl.deploy.placement import topology as topo_mod

    probed: list[list[str]] = []

    def fake_reader(make: object, inv: object) -> object:
        def read(hosts: list[str]) -> dict[str, list[dict[str, object]]]:
            probed.append(hosts)  # GPUs 0 and 3 share a PCIe switch on every host
            return {h: [{"gpus": [0, 3], "level": "SINGLE"}] for h in hosts}

        return read

    monkeypatch.setattr(engine, "Deploy", FakeDeploy)
    monkeypatch.setattr(topo_mod, "fleet_reader", fake_reader)
    FakeDeploy.calls.clear()
    rc, out, _ = run(capsys, "scale", "pool", "--replicas", "10", "--serial", "1", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["after"] == 10 and doc["deploy"]["result"] == "ok"
    assert json.loads((env / "replicas.json").read_text())["replicas"] == {"pool": 10}
    (call,) = FakeDeploy.calls
    assert call["hosts"] == ["gpu01", "gpu02", "gpu03", "gpu04"] and call["state_dir"] == str(env)
    opts = call["opts"]
    assert opts.instances == ",".join(f"pool-{n}" for n in range(1, 11))  # type: ignore[attr-defined]
    assert opts.serial == ["1"]  # type: ignore[attr-defined]
    # placed with the probed topology and recorded before the engine ran, so it starts them there
    assert probed == [["gpu01", "gpu02", "gpu03", "gpu04"]]
    placed = json.loads((env / "placements.json").read_text())["templates"]["pool"]
    assert len(placed) == 10 and placed["pool-1"] == {"host": "gpu01", "gpus": [0, 3], "port": 8000}


def test_placement_show_exits_1_and_gives_the_reason_when_a_replica_has_no_room(
    env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for host in ("gpu01", "gpu02", "gpu03"):
        assert run(capsys, "cordon", host, "--reason", "drained for work")[0] == 0
    rc, out, _ = run(capsys, "placement", "show", "--json")
    rows = {r["replica"]: r for r in json.loads(out)}
    assert rc == 1
    assert [n for n, r in rows.items() if r["host"] == "gpu04"] == ["pool-1", "pool-2", "pool-3", "pool-4"]
    assert rows["pool-5"]["status"].startswith("unplaced: not enough free uncordoned GPUs")
    assert "cordoned hosts: gpu[01-03]" in rows["pool-8"]["status"]
