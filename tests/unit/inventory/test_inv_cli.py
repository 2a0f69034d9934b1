"""``clusterctl inventory ...`` through the real entry point: output and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterctl.cli.main import main
from clusterctl.fleet.failed import save_failed

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = str(ROOT / "inventories" / "example-16xh100-roce.yaml")
BROKEN = str(ROOT / "tests" / "fixtures" / "inventory" / "broken.yaml")
ANSIBLE = ROOT / "tests" / "fixtures" / "inventory" / "ansible"


@pytest.fixture(autouse=True)
def _hermetic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("CLUSTERCTL_INVENTORY", raising=False)
    monkeypatch.setenv("COLUMNS", "200")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_validate_ok(capsys) -> None:
    rc, out, _ = run(capsys, "inventory", "validate", "-i", EXAMPLE)
    assert rc == 0
    assert out.strip() == "OK: 16 hosts, 3 groups, 4 instances, 1 templates"


def test_validate_broken_lists_every_problem_and_exits_3(capsys) -> None:
    rc, out, err = run(capsys, "inventory", "validate", "-i", BROKEN)
    assert rc == 3
    lines = out.splitlines()
    assert lines[0] == f"{BROKEN}:5: defaults.ssh: unknown key 'prot'; did you mean 'port'?"
    assert f"{BROKEN}:59: templates.pool.hosts: unknown group @rack7 (groups: rack1)" in lines
    assert len(lines) == 21
    assert "FAILED: 20 error(s), 1 warning(s)" in err
    assert "Traceback" not in out + err


def test_validate_json(capsys) -> None:
    rc, out, _ = run(capsys, "inventory", "validate", "--json", "-i", BROKEN)
    data = json.loads(out)
    assert rc == 3 and data["ok"] is False
    assert {
        "file": BROKEN,
        "line": 8,
        "message": "fabric.pfc_priority: 9 is out of range 0-7",
        "severity": "error",
    } in data["problems"]


def test_validate_force_accepts_pcie_warning(capsys, tmp_path: Path) -> None:
    f = tmp_path / "pcie.yaml"
    f.write_text(
        "version: 1\n"
        "defaults: {gpus: {count: 4, model: L40S-48GB, interconnect: pcie}}\n"
        "hosts: {l40s1: {}}\n"
        "engines: {v: {path: /opt/vllm/bin/vllm, version: 0.11.0}}\n"
        "models: {m: {path: /models/m}}\n"
        "instances:\n"
        "  qwen8-l40s1-a: {model: m, engine: v, placement: 'l40s1:[0-3]', port: 8000}\n"
    )
    rc, out, _ = run(capsys, "inventory", "validate", "-i", str(f))
    assert rc == 3
    assert "warning: instances.qwen8-l40s1-a: TP 4 on PCIe-only host l40s1" in out
    assert "(use --force to accept)" in out
    rc, out, err = run(capsys, "inventory", "validate", "--force", "-i", str(f))
    assert rc == 0 and out.startswith("OK: 1 hosts")
    assert "TP 4 on PCIe-only host l40s1" in err


def test_missing_inventory_exits_3(capsys, tmp_path: Path) -> None:
    rc, _, err = run(capsys, "inventory", "show", "-i", str(tmp_path / "nope.yaml"))
    assert rc == 3 and "nope.yaml: cannot read the inventory" in err


def test_show_table_groups_identical_hosts(capsys) -> None:
    rc, out, _ = run(capsys, "inventory", "show", "-i", EXAMPLE)
    assert rc == 0
    assert "gpu[09-16]" in out and "10.0.0.[19-26]" in out
    assert "gpu[01-02,04-08]" in out and "gpu03" in out  # the canary differs: its own row
    assert "gpu01:[0-3]" in out and "qwen8-pool" in out
    assert "PFC priority 3" in out


def test_show_json(capsys) -> None:
    rc, out, _ = run(capsys, "inventory", "show", "--json", "-i", EXAMPLE)
    data = json.loads(out)
    assert rc == 0 and len(data["hosts"]) == 16
    llama = next(i for i in data["instances"] if i["name"] == "llama70-a")
    assert llama["tp"] == 8 and llama["placement"][0] == "gpu02:0"
    assert data["hosts"][0]["gpus"]["interconnect"] == "nvlink"


def test_show_json_redacts_secret_env(capsys, tmp_path: Path) -> None:
    f = tmp_path / "inv.yaml"
    f.write_text(
        "version: 1\n"
        "defaults: {gpus: {count: 1}}\n"
        "hosts: {h1: {}}\n"
        "engines: {v: {path: /v, version: '1'}}\n"
        "models: {m: {path: /m}}\n"
        "instances:\n"
        "  a: {model: m, engine: v, placement: [h1:0], port: 8000,\n"
        "      env: {VLLM_API_KEY: s3cret-value, HF_TOKEN: tok-value, VLLM_LOGGING_LEVEL: INFO}}\n"
    )
    rc, out, _ = run(capsys, "inventory", "show", "--json", "-i", str(f))
    assert rc == 0
    env = json.loads(out)["instances"][0]["env"]
    assert env == {"VLLM_API_KEY": "***", "HF_TOKEN": "***", "VLLM_LOGGING_LEVEL": "INFO"}
    assert "s3cret-value" not in out and "tok-value" not in out


def test_hosts_prints_names_and_folded_set(capsys) -> None:
    rc, out, _ = run(capsys, "inventory", "hosts", "-i", EXAMPLE, "@rack1&!@canary")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0] == "gpu01\t10.0.0.11"
    assert lines[-1] == "gpu[01-02,04-08] (7 hosts)"


def test_hosts_json(capsys) -> None:
    rc, out, _ = run(capsys, "inventory", "hosts", "--json", "-i", EXAMPLE, "rack=r2,gpu03")
    data = json.loads(out)
    assert rc == 0 and data["nodeset"] == "gpu[03,09-16]" and data["count"] == 9


@pytest.mark.parametrize(
    "pattern,message",
    [
        ("@rack9", "unknown group @rack9"),
        ("gpu[01", "never closed"),
        ("@failed", "no previous run is recorded"),
    ],
)
def test_hosts_bad_pattern_exits_3(capsys, pattern: str, message: str) -> None:
    rc, _, err = run(capsys, "inventory", "hosts", "-i", EXAMPLE, pattern)
    assert rc == 3 and message in err


def test_hosts_selecting_nothing_exits_3(capsys) -> None:
    rc, _, err = run(capsys, "inventory", "hosts", "-i", EXAMPLE, "@rack1&@rack2")
    assert rc == 3 and "selects no host" in err


def test_hosts_failed_reads_the_previous_run(capsys, tmp_path: Path) -> None:
    save_failed(tmp_path / "state" / "clusterctl", ["gpu05", "gpu11"], inventory=EXAMPLE)
    rc, out, _ = run(capsys, "inventory", "hosts", "-i", EXAMPLE, "@failed")
    assert rc == 0 and out.splitlines()[-1] == "gpu[05,11] (2 hosts)"


def test_import_ansible_to_file_then_validate(capsys, tmp_path: Path) -> None:
    out_file = tmp_path / "converted.yaml"
    rc, out, err = run(capsys, "inventory", "import-ansible", str(ANSIBLE / "dirs" / "hosts.ini"), "-o", str(out_file))
    assert rc == 0 and out == ""
    assert "ansible_become_password dropped" in err and "hunter2" not in err
    assert out_file.is_file()
    assert not any(p.name.startswith(".converted.yaml.") for p in tmp_path.iterdir())
    rc, out, _ = run(capsys, "inventory", "validate", "-i", str(out_file))
    assert rc == 0 and out.startswith("OK: 4 hosts, 2 groups")


def test_import_ansible_unwritable_output_exits_3(capsys, tmp_path: Path) -> None:
    target = tmp_path / "no" / "such" / "dir.yaml"
    rc, _, err = run(capsys, "inventory", "import-ansible", str(ANSIBLE / "basic.ini"), "-o", str(target))
    assert rc == 3 and f"cannot write {target}" in err and "Traceback" not in err


def test_import_ansible_to_stdout(capsys) -> None:
    rc, out, _ = run(capsys, "inventory", "import-ansible", str(ANSIBLE / "basic.ini"))
    assert rc == 0 and out.startswith("# Converted from") and "version: 1" in out


def test_import_ansible_bad_file_exits_3(capsys, tmp_path: Path) -> None:
    f = tmp_path / "hosts"
    f.write_text("[bad:kind]\n")
    rc, _, err = run(capsys, "inventory", "import-ansible", str(f))
    assert rc == 3 and f"{f}:1: bad section header" in err


@pytest.mark.parametrize("command", ["validate", "show", "hosts", "import-ansible"])
def test_every_command_help_has_an_example(capsys, command: str) -> None:
    rc, out, _ = run(capsys, "inventory", command, "--help")
    assert rc == 0 and "Example: clusterctl inventory " + command in out.replace("\n", " ")


@pytest.mark.parametrize("command", [[], ["validate"], ["show"], ["hosts"]])
def test_help_examples_run(capsys, monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    monkeypatch.chdir(ROOT)
    _, out, _ = run(capsys, "inventory", *command, "--help")
    example = " ".join(out.split()).split("Example: ", 1)[1].split(" Options:")[0].split(" Arguments:")[0]
    import shlex

    rc, _, err = run(capsys, *shlex.split(example)[1:])
    assert rc == 0, (example, err)


def test_show_lists_prefill_decode_pools_with_their_ratio(capsys, tmp_path: Path) -> None:
    from tests.unit.deploy.test_pd import BASE, POOL

    f = tmp_path / "pd.yaml"
    f.write_text(BASE + POOL)
    rc, out, _ = run(capsys, "inventory", "show", "-i", str(f))
    assert rc == 0 and "prefill/decode pools" in out
    row = next(line for line in out.splitlines() if "qwen-pd" in line)
    assert "NixlConnector" in row and "1:2" in row and "gw01:8300" in row
    rc, out, _ = run(capsys, "inventory", "show", "--json", "-i", str(f))
    [pool] = json.loads(out)["pd_pools"]
    assert pool["ratio"] == [1, 2] and pool["decode"] == ["qd1", "qd2"] and pool["router"]["port"] == 8300
