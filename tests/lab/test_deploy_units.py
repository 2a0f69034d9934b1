"""Rendered instance units on a real lab host (systemd 252, OpenSSH), run by the simulator.

A tiny synthetic model is staged with ``clusterctl stage`` (so verify-model
passes); the unit and its 0600 EnvironmentFile are written on the host by temp
file + rename; ``systemd-analyze verify`` accepts the unit; ``systemctl start``
brings the simulator up as the non-root ``vllm`` user with its GPU memory
registered; /health answers from this machine; the API key (hostile
characters included) is required and appears in neither ``ps``, the journal
nor the unit file.  A unit whose model path is a hand-copied directory does
not start: ExecStartPre (verify-model) refuses it.  Everything is removed after.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from clusterctl.deploy import spec
from clusterctl.deploy.units.nodesetup import check_gpus_install_script, ensure_user_script, verify_model_install_script
from clusterctl.deploy.units.secrets import resolve_secrets
from clusterctl.deploy.units.sdversion import check_unit_against_systemd
from clusterctl.deploy.units.render import render_instance
from clusterctl.fleet.shell import quote
from clusterctl.inventory.loader import load_inventory
from clusterctl.lab.vllm_sim import synth

from support.http import http, wait_healthy

KEY = 'du-key "q" $HOME %i \\ ;#x \'s\''
#: A string flag the simulator accepts and ignores, carrying systemd's special characters.
HOSTILE_ARG = ("show-hidden-metrics-for-version", "{% if x %}$HOME ${PATH} \"dq\" 'sq' \\n ; %n")
PORT = 8190


def _instances(host: str, src: str) -> str:
    return f"""\
models:
  du-tiny: {{path: /models/du-tiny, source: {src}, version: v1, served_name: du-tiny}}
  du-raw: {{path: /models/du-raw}}
instances:
  du-ok:
    model: du-tiny
    engine: vllm-0.11
    placement: {host}:0
    port: {PORT}
    env: {{VLLM_SIM_TIME_SCALE: "0"}}
    secrets: {{VLLM_API_KEY: {{env: DU_TEST_API_KEY}}}}
  du-raw:
    model: du-raw
    engine: vllm-0.11
    placement: {host}:1
    port: {PORT + 1}
    env: {{VLLM_SIM_TIME_SCALE: "0"}}
"""


def _install(lab, host: str, rendered: spec.RenderedInstance) -> None:
    """Write the env file (0600) and the unit (0644), each temp + rename, then daemon-reload."""
    env, unit = spec.env_path(rendered.instance), spec.unit_path(rendered.instance)
    lab.run(
        host,
        f"install -d -m 0755 {spec.ENV_DIR} && umask 077 && cat > {quote(env + '.tmp')} && "
        f"mv -f {quote(env + '.tmp')} {quote(env)}",
        input=rendered.env_text,
        check=True,
    )
    lab.run(
        host,
        f"umask 022 && cat > {quote(unit + '.tmp')} && mv -f {quote(unit + '.tmp')} {quote(unit)} "
        "&& systemctl daemon-reload",
        input=rendered.unit_text,
        check=True,
    )


@pytest.fixture(scope="module")
def setup(lab, tmp_path_factory):
    host = lab.names[0]
    src = tmp_path_factory.mktemp("du-model") / "tiny"
    synth.write_model("tiny", src, seed=7)
    inv_path = tmp_path_factory.mktemp("du-inv") / "inventory.yaml"
    inv_path.write_text(lab.inventory.read_text() + _instances(host, str(src)))
    had_user = lab.run(host, "id -u vllm").returncode == 0
    had_verify = lab.run(host, "test -e /usr/local/lib/clusterctl/verify-model").returncode == 0
    yield host, inv_path
    for name in ("du-ok", "du-raw"):
        unit = spec.unit_name(name)
        lab.run(
            host,
            f"systemctl stop {unit}; systemctl reset-failed {unit}; rm -f {spec.unit_path(name)} {spec.env_path(name)}",
            timeout=60,
        )
    lab.run(
        host,
        "systemctl daemon-reload; rm -rf /models/du-tiny /models/du-raw /models/.versions/du-tiny; "
        "rmdir /models/.versions 2>/dev/null",
        timeout=60,
    )
    if not had_verify:
        lab.run(
            host,
            "rm -f /usr/local/lib/clusterctl/verify-model /usr/local/lib/clusterctl/check-gpus; "
            "rmdir /usr/local/lib/clusterctl",
        )
    if not had_user:
        lab.run(host, "userdel -r vllm")


def test_rendered_unit_runs_as_vllm_with_the_key_only_in_its_environment_file(lab, setup, monkeypatch):
    host, inv_path = setup
    monkeypatch.setenv("DU_TEST_API_KEY", KEY)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "clusterctl.cli.main",
            "stage",
            "du-tiny",
            "-i",
            str(inv_path),
            "--hosts",
            host,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    inv = load_inventory(str(inv_path))
    inst = inv.instances["du-ok"]
    inst.args[HOSTILE_ARG[0]] = HOSTILE_ARG[1]
    r = render_instance(inv, inst, secrets=resolve_secrets(inv, inst))
    lab.run(host, ensure_user_script("vllm"), check=True)
    _install(lab, host, r)

    mode = lab.run(host, f"stat -c '%a %U' {spec.env_path('du-ok')}", check=True).stdout.split()
    assert mode == ["600", "root"]
    verify = lab.run(host, f"systemd-analyze verify {spec.unit_path('du-ok')}")
    assert verify.returncode == 0 and spec.unit_name("du-ok") not in verify.stderr, verify.stderr
    version = int(re.match(r"systemd (\d+)", lab.run(host, "systemctl --version", check=True).stdout).group(1))
    assert check_unit_against_systemd(r.unit_text, version) == []

    lab.run(host, f"systemctl start {r.unit_name}", check=True, timeout=60)
    base = f"http://{lab.host(host).address}:{PORT}"
    wait_healthy(lab, host, f"{base}/health", r.unit_name, timeout=60)
    assert http(f"{base}/v1/models")[0] == 401
    status, body = http(f"{base}/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200 and json.loads(body)["data"][0]["id"] == "du-tiny"

    pid = lab.run(host, f"systemctl show -p MainPID --value {r.unit_name}", check=True).stdout.strip()
    assert lab.run(host, f"ps -o user= -p {pid}", check=True).stdout.strip() == "vllm"
    argv = lab.run(host, f"cat /proc/{pid}/cmdline", check=True).stdout.split("\0")
    i = argv.index(f"--{HOSTILE_ARG[0]}")
    assert argv[i + 1] == HOSTILE_ARG[1]  # systemd passed the quoted value through unchanged
    gpus = json.loads((lab.host_dir(host) / "hw" / "nvml.json").read_text())["gpus"]
    assert any(p["pid"] == int(pid) for p in gpus[0]["processes"]), "GPU memory not registered as vllm"

    # The key is nowhere but the 0600 file: not in ps, the journal, or the unit.
    ps = lab.run(host, "ps -eo args", check=True).stdout
    journal = lab.run(host, f"journalctl -u {r.unit_name} --no-pager", check=True).stdout
    unit_file = lab.run(host, f"cat {spec.unit_path('du-ok')}", check=True).stdout
    assert "non-default args" in journal
    for where, text in (("ps", ps), ("journal", journal), ("unit file", unit_file)):
        assert "du-key" not in text, f"API key visible in {where}"


def test_unverified_model_does_not_start(lab, setup, monkeypatch):
    host, inv_path = setup
    inv = load_inventory(str(inv_path))
    inst = inv.instances["du-raw"]
    lab.run(host, ensure_user_script("vllm"), check=True)
    lab.run(host, verify_model_install_script(), check=True)
    lab.run(
        host, "mkdir -p /models/du-raw && vllm-sim make-model tiny /models/du-raw >/dev/null", check=True, timeout=60
    )
    r = render_instance(inv, inst, secrets=resolve_secrets(inv, inst))
    _install(lab, host, r)
    assert lab.run(host, f"systemctl start {r.unit_name}", timeout=60).returncode != 0
    state = dict(
        line.split("=", 1)
        for line in lab.run(host, f"systemctl show -p SubState,Result,ExecMainPID {r.unit_name}").stdout.split()
    )
    # vLLM never ran; systemd retries (Restart=on-failure) until the crash-loop guard trips
    assert state["ExecMainPID"] == "0" and state["Result"] == "exit-code", state
    assert state["SubState"] in ("auto-restart", "failed"), state
    journal = lab.run(host, f"journalctl -u {r.unit_name} --no-pager").stdout
    assert "verify-model: refusing to start: /models/du-raw is not a clusterctl-staged symlink" in journal


def _show(lab, host: str, unit: str) -> dict[str, str]:
    out = lab.run(host, f"systemctl show -p ActiveState,SubState,NRestarts,Result {unit}", check=True).stdout
    return dict(line.split("=", 1) for line in out.split())


def _wait(lab, host: str, unit: str, pred, timeout: float = 60.0) -> dict[str, str]:
    import time

    deadline = time.monotonic() + timeout
    while True:
        st = _show(lab, host, unit)
        if pred(st) or time.monotonic() > deadline:
            return st
        time.sleep(1)


def test_uuid_pinned_unit_restarts_after_exit_0_stops_on_request_and_refuses_a_lost_gpu(
    lab, setup, monkeypatch, capsys
):
    """Restart=always brings back a vLLM that exited 0; systemctl stop stays stopped; a unit pinned by
    UUID refuses to start (check-gpus) once its GPU is gone, and doctor says so with the reason."""
    from clusterctl.cli.main import main
    from clusterctl.lab.hardware import faults

    host, inv_path = setup
    monkeypatch.setenv("DU_TEST_API_KEY", KEY)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "clusterctl.cli.main",
            "stage",
            "du-tiny",
            "-i",
            str(inv_path),
            "--hosts",
            host,
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    lab.run(host, ensure_user_script("vllm"), check=True)
    lab.run(host, verify_model_install_script(), check=True)
    lab.run(host, check_gpus_install_script(), check=True)
    listed = lab.run(host, "/usr/local/lib/clusterctl/check-gpus --list", check=True).stdout.split("\n")
    uuid0 = listed[0].split()[1]
    assert listed[0].split()[0] == "0" and uuid0.startswith("GPU-")
    inv = load_inventory(str(inv_path))
    inst = inv.instances["du-ok"]
    r = render_instance(inv, inst, secrets=resolve_secrets(inv, inst), gpu_uuids=[uuid0])
    assert f"CUDA_VISIBLE_DEVICES={uuid0}" in r.unit_text
    _install(lab, host, r)
    unit = r.unit_name
    base = f"http://{lab.host(host).address}:{PORT}"
    try:
        lab.run(host, f"systemctl start {unit}", check=True, timeout=60)
        wait_healthy(lab, host, f"{base}/health", unit, timeout=60)
        # the simulator exits 0 on SIGTERM once serving (as vLLM's server does when its engine dies)
        lab.run(host, f"kill -TERM $(systemctl show -p MainPID --value {unit})", check=True)
        st = _wait(lab, host, unit, lambda s: s["NRestarts"] != "0" and s["SubState"] == "running")
        assert st["NRestarts"] == "1" and st["ActiveState"] == "active", st
        wait_healthy(lab, host, f"{base}/health", unit, timeout=60)
        lab.run(host, f"systemctl stop {unit}", check=True, timeout=60)
        # An explicit stop is not restarted.  systemctl stop returns once its job is done, so the state is
        # already final: a restart would be pending as SubState=auto-restart (activating, RestartSec's timer
        # running) or a queued start job; dead with no job means nothing will start it (no RestartSec wait).
        st = dict(
            line.split("=", 1)
            for line in lab.run(
                host, f"systemctl show -p ActiveState,SubState,Job {unit}", check=True
            ).stdout.splitlines()
            if "=" in line
        )
        assert (st["ActiveState"], st["SubState"], st.get("Job", "")) == ("inactive", "dead", ""), st
        assert unit not in lab.run(host, "systemctl list-jobs --no-legend", check=True).stdout

        faults.inject(lab.host_dir(host), "gpu-lost", gpu=0, log=False)
        assert lab.run(host, f"systemctl start {unit}", timeout=60).returncode != 0
        journal = lab.run(host, f"journalctl -u {unit} --no-pager -n 50").stdout
        assert f"check-gpus: refusing to start: placed GPU(s) {uuid0} not present" in journal, journal
        rc = main(["doctor", host, "-i", str(inv_path), "--json", "--checks", "serving.unit"])
        rep = json.loads(capsys.readouterr().out)
        # one current row; an earlier run's problems may add an OK "history: ..." row (issue 28)
        [f] = [f for f in rep["findings"] if f["subject"] == "instance:du-ok" and f["severity"] != "OK"]
        assert rc == 2 and f["severity"] == "CRIT", f
        # failed, or between the automatic restarts that keep hitting the same refusal
        assert f["message"].startswith(("down: unit ", "crash loop: ")), f["message"]
        assert f"check-gpus: placed GPU(s) {uuid0} not present" in f["message"], f["message"]
    finally:
        faults.inject(lab.host_dir(host), "gpu-lost", gpu=0, lost=False, log=False)
        lab.run(host, f"systemctl stop {unit}; systemctl reset-failed {unit}", timeout=60)
