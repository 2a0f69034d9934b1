"""``clusterctl engine install`` / ``remove`` on the lab (issue 23), on the first lab host only (any
name, root or a sudo user): a tiny vLLM stand-in wheel (tests/support/wheels.py) plus the control
machine's bundled pip wheel (lab hosts have no ensurepip) shipped as the wheelhouse into a new engine
path; ``engine list`` then shows it installed with its version; a second install is unchanged; remove
is refused while a clusterctl unit's ExecStart= runs it, and done once none does.  About 15 s."""

from __future__ import annotations

import json

import yaml

from clusterctl.cli.main import main
from support.wheels import build_wheel, copy_bundled_pip

ENGINE, PATH, VERSION = "vllm-tiny", "/opt/vllm-9.9.1/bin/vllm", "9.9.1"
UNIT = "/etc/systemd/system/clusterctl-engine-test.service"


def _run(capsys, *args: str) -> tuple[int, str]:
    rc = main(list(args))
    return rc, capsys.readouterr().out


def test_engine_install_list_refused_remove_and_remove(lab, capsys, tmp_path):
    host = lab.names[0]
    doc = yaml.safe_load(lab.inventory.read_text())
    doc["engines"][ENGINE] = {"path": PATH, "version": VERSION}
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    wheels = tmp_path / "wheelhouse"
    build_wheel(wheels, VERSION)
    copy_bundled_pip(wheels)
    common = ("-i", str(inv), "--hosts", host)
    try:
        rc, out = _run(capsys, "engine", "install", ENGINE, "--plan", "--detailed-exitcode", *common)
        assert rc == 1 and f"{PATH}: missing -> installed (vllm {VERSION})" in out, out
        rc, out = _run(capsys, "engine", "install", ENGINE, "--wheels", str(wheels), "--json", *common)
        assert rc == 0, out
        assert [h["status"] for h in json.loads(out)["hosts"]] == ["changed"]
        rc, out = _run(capsys, "engine", "list", ENGINE, "--json", *common)
        [row] = json.loads(out)["engines"]
        assert rc == 0 and (row["state"], row["version"], row["version_matches"]) == ("installed", VERSION, True)
        rc, out = _run(capsys, "engine", "install", ENGINE, "--wheels", str(wheels), *common)
        assert rc == 0 and f"{host}: unchanged" in out, out

        assert lab.run(host, f"printf '[Service]\\nExecStart={PATH} serve /m --port 8000\\n' > {UNIT}").returncode == 0
        rc, out = _run(capsys, "engine", "remove", ENGINE, *common)
        assert rc == 2 and "used by clusterctl-engine-test.service" in out, out
        assert lab.run(host, f"test -x {PATH}").returncode == 0
        assert lab.run(host, f"rm -f {UNIT}").returncode == 0
        rc, out = _run(capsys, "engine", "remove", ENGINE, "--json", *common)
        assert rc == 0 and [h["status"] for h in json.loads(out)["hosts"]] == ["changed"], out
        rc, out = _run(capsys, "engine", "list", ENGINE, "--json", *common)
        assert rc == 1 and json.loads(out)["engines"][0]["state"] == "missing"
    finally:
        lab.run(host, f"rm -f {UNIT}; rm -rf /opt/vllm-9.9.1 /opt/.vllm-9.9.1.clusterctl-*")
