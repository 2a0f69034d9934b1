"""Rendering instances as systemd units: goldens, quoting, secrets, systemd versions.

Goldens live in tests/fixtures/deploy/units/; after an intended change to the
template, regenerate them with ``CLUSTERCTL_UPDATE_GOLDEN=1 pytest tests/unit/deploy/test_units.py``
and review the diff.
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from clusterctl.deploy import spec
from clusterctl.deploy.units.nodesetup import ensure_user_script, verify_model_install_script
from clusterctl.deploy.units.sdquote import env_file_line, systemd_quote
from clusterctl.deploy.units.sdversion import MIN_SYSTEMD, check_unit_against_systemd, unit_directives
from clusterctl.deploy.units.secrets import resolve_secrets
from clusterctl.deploy.units.render import UnitPolicy, nccl_ib_tc, policy_for_systemd, render_instance, x_clusterctl
from clusterctl.errors import ClusterctlError, ConfigError
from clusterctl.inventory.loader import load_inventory, load_inventory_text
from clusterctl.inventory.model import FabricProfile
from clusterctl.stage.bundle import verify_model

GOLDEN = Path(__file__).parents[2] / "fixtures" / "deploy" / "units"
API_KEY = "sk-test-Zq9\"$HOME' %i;\\x"
HOSTILE = ["{% if x %}$HOME ${PATH} \"dq\" 'sq' \\n ;", ";", "", "a b\tc", "%n%%", "$$", "tail\\", "é ü"]

INVENTORY = """\
version: 1
defaults:
  ssh: {user: root}
  gpus: {count: 4, model: H100-SXM5-80GB, memory_gib: 80, interconnect: nvlink}
  nics:
    - {netdev: eth0, role: management}
    - {netdev: eth2, role: data, rdma_device: mlx5_0, port: 1}
fabric: {kind: roce, roce_dscp: 26}
hosts:
  gpu01:
    address: 10.0.0.11
  gpu02:
    address: 10.0.0.12
    nics:
      - {netdev: eth0, role: management}
      - {netdev: ens1f0, role: data, rdma_device: mlx5_2, port: 1, address: 10.1.0.12}
      - {netdev: ens1f1, role: data, rdma_device: mlx5_3, port: 1}
engines:
  vllm-0.11: {path: /opt/vllm-0.11/bin/vllm, version: "0.11.0"}
models:
  qwen3-8b: {path: /models/qwen3-8b, version: "2025-06", served_name: qwen3-8b}
  tiny: {path: /models/tiny}
instances:
  tp1:
    model: tiny
    engine: vllm-0.11
    placement: gpu01:2
    port: 8001
  tp2:
    model: qwen3-8b
    engine: vllm-0.11
    placement: gpu02:[1-2]
    port: 8002
    args: {max-model-len: 32768, gpu-memory-utilization: 0.85, enforce-eager: false,
           enable-prefix-caching: true, disable-log-stats: false}
    env: {VLLM_LOGGING_LEVEL: INFO, HF_TOKEN: "hf-env-token"}
    secrets:
      VLLM_API_KEY: {env: CLUSTERCTL_TEST_API_KEY}
  hostile:
    model: tiny
    engine: vllm-0.11
    placement: gpu01:3
    port: 8003
    args:
      chat-template: "{% if x %}$HOME ${PATH} \\"dq\\" 'sq' \\\\n ;"
      served-model-name: ["a b", "%n", "x;y"]
      seed: 0
      middleware: [m1, m2]
      sim-broken-quantization: false
    env: {GREETING: "hi $USER %h \\"q\\" \\\\"}
"""


@pytest.fixture
def inv(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERCTL_SSH_CONFIG", "none")
    monkeypatch.setenv("CLUSTERCTL_TEST_API_KEY", API_KEY)
    p = tmp_path / "inventory.yaml"
    p.write_text(INVENTORY)
    return load_inventory(str(p))


def _render(inv, name, policy=None):
    inst = inv.instances[name]
    return render_instance(inv, inst, secrets=resolve_secrets(inv, inst), policy=policy)


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("CLUSTERCTL_UPDATE_GOLDEN") == "1":
        path.write_text(text)
    assert text == path.read_text(), f"{name} differs from its golden (see module doc to regenerate)"


@pytest.mark.parametrize(
    "case,policy",
    [
        ("tp1", None),
        ("tp2", None),
        ("hostile", None),
        ("tp1-no-boot", UnitPolicy(enable_at_boot=False, user="svc-llm", extra_after=("srv-models.mount",))),
    ],
)
def test_rendered_unit_and_env_match_goldens(inv, case, policy):
    r = _render(inv, case.split("-")[0], policy)
    _check_golden(f"{case}.service", r.unit_text)
    _check_golden(f"{case}.env", r.env_text)


def test_tp2_unit_runs_vllm_on_its_gpus_and_data_nic(inv):
    r = _render(inv, "tp2")
    assert r.gpus == (1, 2) and r.host == "gpu02" and r.model_version == "2025-06"
    assert "Environment=CUDA_VISIBLE_DEVICES=1,2" in r.unit_text
    assert "--tensor-parallel-size 2" in r.unit_text
    # the first data NIC carries sockets and VLLM_HOST_IP; every data NIC's HCA is listed exactly
    assert "Environment=NCCL_SOCKET_IFNAME=ens1f0" in r.unit_text
    assert "Environment=VLLM_HOST_IP=10.1.0.12" in r.unit_text
    assert "Environment=NCCL_IB_HCA==mlx5_2:1,mlx5_3:1" in r.unit_text
    assert "Environment=NCCL_IB_TC=106" in r.unit_text
    assert "--no-enforce-eager" in r.unit_text and "--enable-prefix-caching" in r.unit_text
    assert "--no-disable-log-stats" not in r.unit_text and "disable-log-stats" not in r.unit_text
    assert x_clusterctl(r.unit_text) == {
        "Instance": "tp2",
        "Host": "gpu02",
        "Model": "qwen3-8b",
        "ModelPath": "/models/qwen3-8b",
        "ModelVersion": "2025-06",
        "Engine": "vllm-0.11",
        "EngineVersion": "0.11.0",
        "GPUs": "1,2",
        "Port": "8002",
        "TP": "2",
    }


def test_data_nic_without_address_sets_no_host_ip(inv):
    r = _render(inv, "tp1")
    assert "NCCL_SOCKET_IFNAME=eth2" in r.unit_text and "VLLM_HOST_IP" not in r.unit_text


def test_nccl_ib_tc_is_the_dscp_shifted_with_ect0():
    assert nccl_ib_tc(FabricProfile(roce_dscp=26)) == 106
    assert nccl_ib_tc(FabricProfile(roce_dscp=24)) >> 2 == 24


def test_no_secret_in_unit_redacted_env_or_repr(inv):
    r = _render(inv, "tp2")
    assert r.secret_keys == {"VLLM_API_KEY", "HF_TOKEN"}
    for secret in (API_KEY, "hf-env-token"):
        assert secret not in r.unit_text
        assert secret not in r.redacted_env()
        assert secret not in repr(r)
        assert secret not in str(r)
    assert env_file_line("VLLM_API_KEY", API_KEY) in r.env_text.splitlines()
    assert "VLLM_API_KEY=***" in r.redacted_env()
    assert "api-key" not in r.unit_text


def test_api_key_flag_and_placement_env_are_refused(inv):
    inst = inv.instances["tp1"]
    inst.args["api-key"] = "k"
    with pytest.raises(ClusterctlError, match="secret on the command line"):
        render_instance(inv, inst, secrets={})
    del inst.args["api-key"]
    inst.env["CUDA_VISIBLE_DEVICES"] = "0"
    with pytest.raises(ClusterctlError, match="CUDA_VISIBLE_DEVICES is set from the placement"):
        render_instance(inv, inst, secrets={})
    del inst.env["CUDA_VISIBLE_DEVICES"]
    inst.env["A B"] = "x"
    with pytest.raises(ClusterctlError, match="'A B' is not an environment variable name"):
        render_instance(inv, inst, secrets={})


def test_unresolved_secret_is_refused(inv):
    with pytest.raises(ClusterctlError, match="VLLM_API_KEY not resolved"):
        render_instance(inv, inv.instances["tp2"], secrets={})


def test_rendering_is_deterministic(inv):
    assert _render(inv, "tp2").digest == _render(inv, "tp2").digest


# --------------------------------------------------------------- secrets


def test_missing_env_secret_names_the_inventory_line(inv, monkeypatch):
    monkeypatch.delenv("CLUSTERCTL_TEST_API_KEY")
    with pytest.raises(ConfigError) as e:
        resolve_secrets(inv, inv.instances["tp2"])
    msg = str(e.value)
    assert msg.startswith(f"{inv.path}:")
    line = int(msg.split(":")[1])
    assert "VLLM_API_KEY" in INVENTORY.splitlines()[line - 1]
    assert "CLUSTERCTL_TEST_API_KEY is not set" in msg


def test_file_secret_is_relative_to_the_inventory(tmp_path, monkeypatch):
    monkeypatch.setenv("CLUSTERCTL_SSH_CONFIG", "none")
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "api").write_text("file-secret-value\n")
    text = INVENTORY.replace("{env: CLUSTERCTL_TEST_API_KEY}", "{file: keys/api}")
    (tmp_path / "inv.yaml").write_text(text)
    inv = load_inventory(str(tmp_path / "inv.yaml"))
    monkeypatch.chdir("/")
    assert resolve_secrets(inv, inv.instances["tp2"]) == {"VLLM_API_KEY": "file-secret-value"}
    (tmp_path / "keys" / "api").unlink()
    with pytest.raises(ConfigError, match=r"inv\.yaml:\d+: instances\.tp2\.secrets\.VLLM_API_KEY: cannot read"):
        resolve_secrets(inv, inv.instances["tp2"])


def test_template_secrets_reach_its_instances(monkeypatch):
    monkeypatch.setenv("CLUSTERCTL_SSH_CONFIG", "none")
    monkeypatch.setenv("POOL_KEY", "pool-secret")
    text = (
        INVENTORY
        + """\
templates:
  pool:
    model: tiny
    engine: vllm-0.11
    replicas: 1
    tp: 1
    hosts: gpu01
    port_base: 9000
    secrets: {VLLM_API_KEY: {env: POOL_KEY}}
"""
    )
    inv = load_inventory_text(text)
    inst = inv.instances["tp1"]
    inst.template = "pool"
    assert resolve_secrets(inv, inst) == {"VLLM_API_KEY": "pool-secret"}


def test_inventory_rejects_bad_secret_references(monkeypatch):
    monkeypatch.setenv("CLUSTERCTL_SSH_CONFIG", "none")
    bad = INVENTORY.replace(
        "VLLM_API_KEY: {env: CLUSTERCTL_TEST_API_KEY}",
        "VLLM_API_KEY: {env: A, file: b}\n      HF_TOKEN: {env: X}\n      9X: {env: Y}",
    )
    with pytest.raises(ConfigError) as e:
        load_inventory_text(bad, "inv.yaml")
    msg = str(e.value)
    assert "instances.tp2.secrets.VLLM_API_KEY: give exactly one of env" in msg
    assert "instances.tp2.secrets.HF_TOKEN: also set under env" in msg
    assert "'9X' is not an environment variable name" in msg


# --------------------------------------------------------------- quoting


def _systemd_unquote(text: str) -> list[str]:
    """A reference reading of a command line as systemd does (systemd.syntax(7)):
    split at unquoted whitespace, quotes group, C escapes decoded, then ``%%`` -> ``%``
    and ``$$`` -> ``$`` (no other specifier or variable may appear)."""
    words, cur, quote, have = [], [], None, False
    esc = {
        "n": "\n",
        "t": "\t",
        "r": "\r",
        "a": "\a",
        "b": "\b",
        "f": "\f",
        "v": "\v",
        "\\": "\\",
        '"': '"',
        "'": "'",
        " ": " ",
    }
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\":
            n = text[i + 1]
            if n == "x":
                cur.append(chr(int(text[i + 2 : i + 4], 16)))
                i += 4
                continue
            cur.append(esc[n])
            i += 2
            have = True
            continue
        if quote:
            if c == quote:
                quote = None
            else:
                cur.append(c)
        elif c in "\"'":
            quote, have = c, True
        elif c in " \t":
            if have or cur:
                words.append("".join(cur))
            cur, have = [], False
        else:
            cur.append(c)
            have = True
        i += 1
    assert quote is None
    if have or cur:
        words.append("".join(cur))
    out = []
    for w in words:
        assert "%" not in w.replace("%%", ""), f"unescaped specifier in {w!r}"
        assert "$" not in w.replace("$$", ""), f"unescaped variable in {w!r}"
        out.append(w.replace("%%", "%").replace("$$", "$"))
    return out


@pytest.mark.parametrize("value", HOSTILE + ["plain", "--flag", "/opt/x y/bin/vllm", "\x01\x7f", "new\nline"])
def test_systemd_quote_gives_back_exactly_one_word(value):
    q = systemd_quote(value)
    assert _systemd_unquote(q) == [value]
    assert "\n" not in q
    # a lone ';' must never be bare (old systemd split commands on it)
    assert q != ";"


def test_systemd_quote_leaves_plain_words_bare_and_refuses_nul():
    assert systemd_quote("--max-model-len") == "--max-model-len"
    assert systemd_quote("/models/qwen3-8b") == "/models/qwen3-8b"
    assert systemd_quote("50%") == "50%%"
    assert systemd_quote("a b") == '"a b"'
    assert systemd_quote("$x", dollar=False) == "$x"
    with pytest.raises(ClusterctlError):
        systemd_quote("a\0b")


def test_hostile_unit_argv_reads_back_as_given(inv):
    r = _render(inv, "hostile")
    lines = r.unit_text.split("ExecStart=", 1)[1].split("\nSyslogIdentifier=")[0]
    argv = _systemd_unquote(lines.replace("\\\n", " "))
    i = argv.index("--chat-template")
    assert argv[i + 1] == "{% if x %}$HOME ${PATH} \"dq\" 'sq' \\n ;"
    j = argv.index("--served-model-name")
    assert argv[j + 1 : j + 4] == ["a b", "%n", "x;y"]
    assert argv.count("--middleware") == 2
    assert "--served-model-name" in argv and argv.count("--served-model-name") == 1
    assert "--sim-broken-quantization" not in argv and "--no-sim-broken-quantization" not in argv


def _env_file_unquote(line: str) -> tuple[str, str]:
    key, _, rest = line.partition("=")
    assert rest[0] == '"' and rest[-1] == '"'
    body, out, i = rest[1:-1], [], 0
    while i < len(body):
        if body[i] == "\\":
            assert body[i + 1] in '"\\$`'
            out.append(body[i + 1])
            i += 2
        else:
            assert body[i] != '"'
            out.append(body[i])
            i += 1
    return key, "".join(out)


@pytest.mark.parametrize("value", HOSTILE[:2] + [API_KEY, "`id`", " lead and trail "])
def test_env_file_line_round_trips(value):
    assert _env_file_unquote(env_file_line("K", value)) == ("K", value)


def test_env_file_line_refuses_newlines_without_echoing_the_value():
    with pytest.raises(ClusterctlError) as e:
        env_file_line("VLLM_API_KEY", "top\nsecret")
    assert "top" not in str(e.value) and "VLLM_API_KEY" in str(e.value)


# --------------------------------------------------------------- systemd versions


def test_units_need_exactly_the_stated_minimum_systemd(inv):
    for name in ("tp1", "tp2", "hostile"):
        text = _render(inv, name).unit_text
        assert check_unit_against_systemd(text, MIN_SYSTEMD) == []
    assert MIN_SYSTEMD == 230
    old = check_unit_against_systemd(_render(inv, "tp1").unit_text, 229)
    assert any("StartLimitIntervalSec needs systemd >= 230; this host has 229" in p for p in old)


def test_directive_outside_the_table_is_reported():
    unit = "[Service]\nType=exec\nProtectSystem=strict\n[X-Clusterctl]\nAnything=1\n"
    problems = check_unit_against_systemd(unit, 255)
    assert len(problems) == 2
    assert "[Service] Type=exec" in problems[0] and "ProtectSystem" in problems[1]


def test_vllm_that_exits_0_is_restarted_and_the_fabric_manager_is_wanted(inv):
    # vLLM's API server exits with status 0 when its engine dies: only Restart=always brings it back
    d = {(s, k): v for s, k, v in unit_directives(_render(inv, "tp1").unit_text)}
    assert d[("Service", "Restart")] == "always"
    assert "nvidia-fabricmanager.service" in d[("Unit", "Wants")].split()
    assert "nvidia-fabricmanager.service" in d[("Unit", "After")].split()


def test_start_limit_is_sized_for_slow_loading_models():
    # 5 starts of a model that loads for 10 minutes then dies take ~51 minutes: the guard must span that
    p = UnitPolicy()
    assert p.start_limit_interval == 5 * (600 + 10) and p.start_limit_interval > 5 * 600
    stepped = policy_for_systemd(255)
    assert stepped.restart_steps == 5 and stepped.start_limit_interval == 5 * (600 + 300)
    assert UnitPolicy(load_time_s=180).start_limit_interval == 5 * 190
    assert UnitPolicy(start_limit_interval_s=4000).start_limit_interval == 4000


@pytest.mark.parametrize(
    "version,steps", [(None, False), (230, False), (252, False), (253, False), (254, True), (255, True)]
)
def test_restart_steps_only_where_the_hosts_systemd_has_them(inv, version, steps):
    text = _render(inv, "tp1", policy_for_systemd(version)).unit_text
    d = {(s, k): v for s, k, v in unit_directives(text)}
    assert (("Service", "RestartSteps") in d) is steps
    assert (("Service", "RestartMaxDelaySec") in d) is steps
    if steps:
        assert d[("Service", "RestartSteps")] == "5" and d[("Service", "RestartMaxDelaySec")] == "300"
    # whatever was chosen runs on that host's systemd (the per-directive table)
    assert check_unit_against_systemd(text, version or MIN_SYSTEMD) == []
    if steps:
        assert any("RestartSteps needs systemd >= 254" in p for p in check_unit_against_systemd(text, 253))


def test_policy_refuses_a_crash_loop_guard_that_cannot_trip():
    with pytest.raises(ClusterctlError, match="never trips"):
        UnitPolicy(start_limit_burst=5, restart_sec=60, start_limit_interval_s=300)
    with pytest.raises(ClusterctlError):
        UnitPolicy(user="root; rm")


# --------------------------------------------------------------- node setup


def _fake_bin(tmp_path: Path, user_exists: bool) -> dict[str, str]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "calls"
    scripts = {
        "id": f"#!/bin/sh\necho id \"$@\" >> {log}\n{'echo 999' if user_exists else 'exit 1'}\n",
        "useradd": f"#!/bin/sh\necho useradd \"$@\" >> {log}\n",
        "getent": f"#!/bin/sh\necho 'vllm:x:999:999::{tmp_path}/home:/usr/sbin/nologin'\n",
        "install": f"#!/bin/sh\necho install \"$@\" >> {log}\n",
    }
    for name, body in scripts.items():
        (bindir / name).write_text(body)
        (bindir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bindir}:/usr/bin:/bin"}


def test_ensure_user_script_creates_once_with_no_login_shell(tmp_path):
    env = _fake_bin(tmp_path, user_exists=False)
    subprocess.run(["sh", "-c", ensure_user_script("vllm")], env=env, check=True)
    calls = (tmp_path / "calls").read_text()
    assert "useradd --system --user-group --create-home --home-dir /var/lib/vllm" in calls
    useradd = next(line for line in calls.splitlines() if line.startswith("useradd"))
    assert "--shell /usr/sbin/nologin" in useradd and useradd.endswith(" vllm")
    assert "install -d -m 0750 -o vllm" in calls  # the missing home is created
    (tmp_path / "calls").unlink()
    (tmp_path / "home").mkdir()
    env = {**env, "PATH": env["PATH"].replace(str(tmp_path / "bin"), str(tmp_path / "bin2"))}
    (tmp_path / "bin").rename(tmp_path / "bin2")
    (tmp_path / "bin2" / "id").write_text(f"#!/bin/sh\necho id \"$@\" >> {tmp_path}/calls\necho 999\n")
    subprocess.run(["sh", "-c", ensure_user_script("vllm")], env=env, check=True)
    calls = (tmp_path / "calls").read_text()
    assert "useradd" not in calls and "install" not in calls
    with pytest.raises(ClusterctlError):
        ensure_user_script("bad user")


def test_verify_model_install_script_installs_atomically_and_idempotently(tmp_path):
    dest = tmp_path / "lib" / "verify-model"
    subprocess.run(["sh", "-c", verify_model_install_script(str(dest))], check=True)
    assert dest.read_bytes() == verify_model().data  # the builder's output, its sha256 checked on the node
    assert stat.S_IMODE(dest.stat().st_mode) == 0o755
    ino = dest.stat().st_ino
    subprocess.run(["sh", "-c", verify_model_install_script(str(dest))], check=True)
    assert dest.stat().st_ino == ino  # unchanged content: not rewritten
    assert [p.name for p in dest.parent.iterdir()] == ["verify-model"]


def test_unit_and_env_paths_come_from_spec(inv):
    r = _render(inv, "tp1")
    assert f"EnvironmentFile={spec.env_path('tp1')}" in r.unit_text
    assert r.unit_name == "clusterctl-tp1.service"


def test_model_path_ending_in_backslash_does_not_swallow_the_next_key(inv):
    """A trailing ``\\`` would continue the ``ModelPath=`` line into ``ModelVersion=`` (issue 21)."""
    from clusterctl.node.deploy import _x_section
    from clusterctl.deploy.units.sdversion import unit_directives

    inv.models["qwen3-8b"].path = "/models/odd\\"
    r = _render(inv, "tp2")
    x = x_clusterctl(r.unit_text)
    assert x["ModelPath"] == "/models/odd\\" and x["ModelVersion"] == "2025-06"
    assert _x_section(r.unit_text)["ModelPath"] == "/models/odd\\"  # what the node program reports
    keys = [k for s, k, _ in unit_directives(r.unit_text) if s == "X-Clusterctl"]
    assert keys == [
        "Instance",
        "Host",
        "Model",
        "ModelPath",
        "ModelVersion",
        "Engine",
        "EngineVersion",
        "GPUs",
        "Port",
        "TP",
    ]


# --------------------------------------------------------------- GPU identity

UUIDS = ["GPU-3b1f6a52-8c7d-4e2a-9f10-5a6b7c8d9e01", "GPU-9e0d8c7b-6a5f-4e3d-2c1b-0a9f8e7d6c5b"]


def test_gpus_pinned_by_uuid_with_a_check_before_start(inv):
    r = _render(inv, "tp2")
    inst = inv.instances["tp2"]
    pinned = render_instance(inv, inst, secrets=resolve_secrets(inv, inst), gpu_uuids=UUIDS)
    env = [v for s, k, v in unit_directives(pinned.unit_text) if k == "Environment"]
    assert f"CUDA_VISIBLE_DEVICES={','.join(UUIDS)}" in env
    pre = [v for s, k, v in unit_directives(pinned.unit_text) if k == "ExecStartPre"]
    assert pre[0].startswith("/usr/local/lib/clusterctl/verify-model ")
    assert pre[1] == "/usr/local/lib/clusterctl/check-gpus " + " ".join(UUIDS)
    assert x_clusterctl(pinned.unit_text)["GPUUUIDs"] == ",".join(UUIDS)
    assert x_clusterctl(pinned.unit_text)["GPUs"] == x_clusterctl(r.unit_text)["GPUs"] == "1,2"
    assert check_unit_against_systemd(pinned.unit_text, MIN_SYSTEMD) == []
    # without UUIDs (no NVML answer on the host): indexes, as before
    assert "CUDA_VISIBLE_DEVICES=1,2" in [v for s, k, v in unit_directives(r.unit_text) if k == "Environment"]
    with pytest.raises(ClusterctlError, match="do not match its 2 placed GPU"):
        render_instance(inv, inst, secrets=resolve_secrets(inv, inst), gpu_uuids=UUIDS[:1])
    with pytest.raises(ClusterctlError):
        render_instance(inv, inst, secrets=resolve_secrets(inv, inst), gpu_uuids=["1", "2"])


def test_uuids_recorded_at_placement_stay_when_the_indexes_shift(inv):
    from clusterctl.deploy.rollout.engine import pinned_uuids
    from clusterctl.deploy.remote import HostState, InstanceState

    inst = inv.instances["tp2"]  # gpu02:1,2
    now = {0: "GPU-00000000-0000-4000-8000-000000000000", 1: UUIDS[1], 2: "GPU-22222222-2222-4222-8222-222222222222"}
    assert pinned_uuids(inst, HostState("gpu02", gpu_uuids=now)) == [UUIDS[1], now[2]]  # placed now
    unit = InstanceState(
        "tp2", "", "d", {}, True, "active", "running", 0, 1, "enabled", 0, {"GPUs": "1,2", "GPUUUIDs": ",".join(UUIDS)}
    )
    # a GPU was lost and the host rebooted: index 1 is now another GPU; the unit keeps its UUIDs
    assert pinned_uuids(inst, HostState("gpu02", {"tp2": unit}, gpu_uuids=now)) == UUIDS
    moved = InstanceState(**{**unit.__dict__, "x": {"GPUs": "0,1", "GPUUUIDs": ",".join(UUIDS)}})
    assert pinned_uuids(inst, HostState("gpu02", {"tp2": moved}, gpu_uuids=now)) == [UUIDS[1], now[2]]
    assert pinned_uuids(inst, HostState("gpu02")) is None and pinned_uuids(inst, None) is None
