"""``clusterctl engine install`` / ``remove`` on the lab (issue 23), on the first lab host only (any
name, root or a sudo user).

The engine is the vLLM simulator packaged as the wheel ``vllm-0.11.0``
(``clusterctl.lab.vllm_sim.install.build_wheel``: the real CPU build, 3.4 GB a host, does not fit the
lab), shipped with the control machine's bundled pip wheel (lab hosts have no ensurepip) into a new
engine path: the plan names the install, the install checks ``vllm --version`` and the import, ``engine
list`` shows it with its version; ``clusterctl deploy`` then runs an instance on it (the unit's
ExecStart= is the installed engine, the deploy's health gate passed: /health, /v1/models and a
completion answered by it); ``engine remove`` is refused while that unit runs it (a ``refused`` host,
not ``unread``) and removes it once the unit is gone."""

from __future__ import annotations

import json

import yaml

from clusterctl.cli.main import main
from clusterctl.deploy import spec
from clusterctl.lab.vllm_sim import synth
from clusterctl.lab.vllm_sim.install import build_wheel
from support.wheels import copy_bundled_pip

ENGINE, ROOT, VERSION = "vllm-sim-pkg", "/opt/vllm-0.11.0-sim", "0.11.0"
PATH = f"{ROOT}/bin/vllm"
INSTANCE, MODEL, PORT = "ei-sim", "/models/ei-tiny", 8196


def _run(capsys, *args: str) -> tuple[int, str]:
    rc = main(list(args))
    return rc, capsys.readouterr().out


def test_an_installed_engine_is_deployed_on_and_not_removed_while_its_unit_runs(lab, capsys, tmp_path):
    host = lab.names[0]
    src = tmp_path / "model"
    synth.write_model("tiny", src, seed=7)
    doc = yaml.safe_load(lab.inventory.read_text())
    doc["engines"][ENGINE] = {"path": PATH, "version": VERSION}
    doc["models"] = {"ei-tiny": {"path": MODEL, "source": str(src), "version": "v1", "served_name": "ei-tiny"}}
    doc["instances"] = {
        INSTANCE: {
            "model": "ei-tiny",
            "engine": ENGINE,
            "placement": f"{host}:6",
            "port": PORT,
            "env": {"VLLM_SIM_TIME_SCALE": "0"},
        }
    }
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    wheels = tmp_path / "wheelhouse"
    build_wheel(wheels, VERSION)
    copy_bundled_pip(wheels)
    common = ("-i", str(inv), "--hosts", host)
    had_user = lab.run(host, "id -u vllm").returncode == 0
    try:
        rc, out = _run(capsys, "engine", "install", ENGINE, "--plan", "--detailed-exitcode", *common)
        assert rc == 1 and f"{PATH}: missing -> installed (vllm {VERSION})" in out, out
        rc, out = _run(capsys, "engine", "install", ENGINE, "--wheels", str(wheels), "--json", *common)
        assert rc == 0 and [h["status"] for h in json.loads(out)["hosts"]] == ["changed"], out
        rc, out = _run(capsys, "engine", "list", ENGINE, "--json", *common)
        [row] = json.loads(out)["engines"]
        assert rc == 0 and (row["state"], row["version"], row["version_matches"]) == ("installed", VERSION, True)

        # used: a real deploy of an instance on the installed engine (its gate passed: served by it)
        rc, out = _run(capsys, "deploy", *common, "--instances", INSTANCE, "--gate-timeout", "90", "--json")
        assert rc == 0, out
        shown = lab.run(
            host,
            f"systemctl show -p ExecStart --value {spec.unit_name(INSTANCE)}; "
            f"systemctl is-active {spec.unit_name(INSTANCE)}",
        ).stdout
        assert f"path={PATH} ;" in shown and shown.split()[-1] == "active", shown

        rc, out = _run(capsys, "engine", "remove", ENGINE, *common)
        assert rc == 2 and f"used by {spec.unit_name(INSTANCE)}" in out, out
        assert "refused 1" in out.splitlines()[-1] and "unread" not in out, out
        assert lab.run(host, f"test -x {PATH}").returncode == 0

        lab.run(
            host,
            f"systemctl stop {spec.unit_name(INSTANCE)}; rm -f {spec.unit_path(INSTANCE)} "
            f"{spec.env_path(INSTANCE)}; systemctl daemon-reload",
            check=True,
            timeout=60,
        )
        rc, out = _run(capsys, "engine", "remove", ENGINE, "--json", *common)
        assert rc == 0 and [h["status"] for h in json.loads(out)["hosts"]] == ["changed"], out
    finally:
        unit = spec.unit_name(INSTANCE)
        lab.run(
            host,
            f"systemctl stop {unit}; systemctl reset-failed {unit}; rm -f {spec.unit_path(INSTANCE)} "
            f"{spec.env_path(INSTANCE)}; systemctl daemon-reload; rm -rf {ROOT} /opt/.vllm-0.11.0-sim.* "
            f"{MODEL} /models/.versions/ei-tiny",
            timeout=60,
        )
        if not had_user:
            lab.run(host, "userdel vllm")
