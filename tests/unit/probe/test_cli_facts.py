"""``clusterctl facts`` end to end through the real Fleet, with a transport
that runs each command in a local shell instead of over SSH (so the real
payload runs with this machine's python3), and one host that cannot be reached."""

from __future__ import annotations

import json
import subprocess

import pytest

from clusterctl.cli import facts as facts_cli
from clusterctl.cli.main import main
from clusterctl.exitcodes import ExitCode
from clusterctl.fleet import HostStatus, ssh
from clusterctl.fleet.transport import FakeReply, FakeTransport, HostFailure
from clusterctl.probe.facts import parse_facts
from clusterctl.probe.payload import payload
from clusterctl.probe.run import FactsResult

INVENTORY = """version: 1
defaults:
  ssh: {user: root}
hosts:
  gpu[01-02]:
    address: 127.0.0.[1-2]
  gpu03:
    address: 127.0.0.3
"""


def local_shell(host, command, stdin):
    if host.name == "gpu03":
        return HostFailure(HostStatus.UNREACHABLE, "connect to 127.0.0.3:22: connection refused")
    p = subprocess.run(["/bin/sh", "-c", command], input=stdin, capture_output=True, timeout=60)
    return FakeReply(p.returncode, p.stdout, p.stderr)


@pytest.fixture
def env(tmp_path, monkeypatch):
    inv = tmp_path / "inv.yaml"
    inv.write_text(INVENTORY)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("CLUSTERCTL_NODE_CACHE_DIR", str(tmp_path / "node" / "programs"))
    transport = FakeTransport(local_shell)
    monkeypatch.setattr(ssh, "ParamikoTransport", lambda **kw: transport)  # the fleet factory's transport
    monkeypatch.setattr(facts_cli.console, "_width", 200)  # patching "width" leaves it pinned for later tests
    return inv, transport


def test_json_has_a_document_or_a_reason_per_host(env, capsys):
    inv, transport = env
    rc = main(["facts", "gpu[01-03]", "-i", str(inv), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == ExitCode.CRIT  # gpu03 gave no facts
    assert list(out) == ["gpu01", "gpu02", "gpu03"]
    assert parse_facts(out["gpu01"]).schema == 1 and out["gpu02"]["schema"] == 1
    assert out["gpu03"] == {
        "status": "unknown",
        "fleet_status": "unreachable",
        "reason": "connect to 127.0.0.3:22: connection refused",
    }
    # the first run ships the payload: a round trip that finds no cached copy, then one with it on stdin
    gpu01 = [c for c in transport.commands if c[0] == "gpu01"]
    assert [len(c[2] or b"") for c in gpu01] == [0, len(payload().data)]
    # the next run finds the verified copy: one round trip, nothing on stdin
    transport.commands.clear()
    assert main(["facts", "gpu[01-02]", "-i", str(inv), "--json"]) == ExitCode.OK
    assert json.loads(capsys.readouterr().out)["gpu01"]["schema"] == 1
    assert [(c[0], c[2] or b"") for c in transport.commands] == [("gpu01", b""), ("gpu02", b"")]


def test_table_groups_identical_hosts_and_failed_is_remembered(env, capsys):
    inv, _ = env
    rc = main(["facts", "all", "-i", str(inv)])
    out = capsys.readouterr().out
    assert rc == ExitCode.CRIT
    lines = [x for x in out.splitlines() if x.strip()]
    assert lines[0].split()[:3] == ["hosts", "status", "GPUs"]
    assert lines[1].split()[:3] == ["gpu[01-02]", "ok", "none"]
    assert lines[2].split() == ["gpu03", "UNKNOWN"]
    assert "gpu[01-02]: gpus: NVML library (libnvidia-ml.so.1) not found: NVML Shared Library Not Found" in lines
    assert "gpu03: connect to 127.0.0.3:22: connection refused" in lines
    # @failed now means gpu03
    rc = main(["facts", "@failed", "-i", str(inv), "--json"])
    assert list(json.loads(capsys.readouterr().out)) == ["gpu03"]


def test_all_hosts_answer_exit_0(env, capsys):
    inv, _ = env
    assert main(["facts", "gpu01", "-i", str(inv), "--json"]) == ExitCode.OK


def test_bad_pattern_is_a_usage_error(env, capsys):
    inv, _ = env
    assert main(["facts", "nosuchhost", "-i", str(inv)]) == ExitCode.UNKNOWN
    err = capsys.readouterr().err
    assert "nosuchhost" in err and "Traceback" not in err


def test_group_rows_merges_identical_summaries():
    doc = {
        "schema": 1,
        "collected_at": "t",
        "host": {},
        "gpus": {
            "available": True,
            "devices": [
                {
                    "index": i,
                    "name": "NVIDIA H100 80GB HBM3",
                    "memory_total": 80 * 2**30,
                    "memory_used": 70 * 2**30,
                    "lost": i == 1,
                    "field_errors": {},
                }
                for i in range(2)
            ],
        },
        "nics": [{"netdev": "eth2", "rdma": {"device": "mlx5_0", "port": 1, "state": "ACTIVE", "rate_gbps": 400.0}}],
        "units": [{"unit": "clusterctl-a.service", "active_state": "active", "restarts": 1}],
        "kernel_log": {},
        "errors": [],
    }
    f = parse_facts(doc)
    rows = facts_cli.group_rows(
        [FactsResult(f"gpu0{i}", "ok", facts=f) for i in (1, 2, 4)]
        + [FactsResult("gpu03", "unknown", reason="timed out")]
    )
    assert rows == [
        (
            "gpu[01-02,04]",
            ("ok", "2x H100 80GB HBM3", "140/160 GiB", "1 lost", "1x ACTIVE 400G", "1 active (1 restarts)", "-"),
        ),
        ("gpu03", ("UNKNOWN", "", "", "", "", "", "")),
    ]


def test_the_timeout_option_defaults_to_the_probes_timeout() -> None:
    """``facts --timeout`` is written out in the CLI (so ``--help`` loads no probe): it stays the probe's."""
    from clusterctl.probe.run import DEFAULT_TIMEOUT_S

    assert facts_cli.FactsTimeoutOpt.default == DEFAULT_TIMEOUT_S
