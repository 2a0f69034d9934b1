"""Bundles: gathered over a (fake) fleet with the real node script, written, read back,
assembled by hand; ``doctor --from`` and ``collect`` end to end through the CLI."""

from __future__ import annotations

import http.server
import json
import os
import re
import shutil
import shlex
import subprocess
import sys
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest

from clusterctl.cli.main import main
from clusterctl.diagnose.bundle import Snapshot, context, read_bundle, write_bundle
from clusterctl.probe.snapshot import gather
from clusterctl.diagnose.findings import Severity
from clusterctl.diagnose.registry import run_analyzers
from clusterctl.fleet.results import HostResult, HostStatus

import gpu_facts as G

INVENTORY_FILE = "site.yaml"


def write_inventory(tmp: Path, text: str = G.INVENTORY) -> Path:
    p = tmp / INVENTORY_FILE
    p.write_text(text)
    return p


def snapshot() -> Snapshot:
    facts = G.healthy()
    facts["gpu01"]["gpus"]["devices"][1]["remapped_rows"]["pending"] = True
    return Snapshot(
        facts=facts,
        missing={"gpu09": "unreachable: timed out"},
        raw={
            "gpu01": {
                "kernel.log": G.fixture("gpu/dmesg_xid_mixed.log"),
                "qwen-a.log": G.fixture("vllm/startup_success_v0.11.0.log"),
                "qwen-a.metrics": G.fixture("vllm/metrics_v0.11.0.prom"),
                "qwen-a.metrics.2": G.fixture("vllm/metrics_v0.11.0.prom"),
            }
        },
        commands={
            "gpu01": [
                {
                    "argv": ["journalctl", "-u", "clusterctl-qwen-a.service"],
                    "rc": 0,
                    "stdout": "verbatim\n",
                    "stderr": "",
                    "started_at": "2026-11-30T10:00:00Z",
                }
            ]
        },
        interval_s=2.0,
        meta={"started_at": "2026-11-30T10:00:00Z"},
    )


def analysis(snap: Snapshot) -> list[tuple[str, str, str | None, str, str]]:
    c = context(snap, G.inventory(), G.ctx().thresholds)
    return sorted((f.check, f.severity.name, f.host, f.subject, f.message) for f in run_analyzers(c))


@pytest.mark.parametrize("name", ["bundle", "bundle.tar.gz"])
def test_round_trip_gives_the_same_findings(tmp_path: Path, name: str):
    snap = snapshot()
    dest = write_bundle(snap, tmp_path / name, G.INVENTORY)
    back, inv_path = read_bundle(dest)
    assert back.facts == snap.facts and back.raw == snap.raw and back.missing == snap.missing
    assert back.interval_s == 2.0 and inv_path is not None and inv_path.read_text() == G.INVENTORY
    assert analysis(back) == analysis(snap)
    if name == "bundle":
        cmd = dest / "hosts" / "gpu01" / "commands"
        assert (cmd / "journalctl_-u_clusterctl-qwen-a.service.txt").read_text() == "verbatim\n"
        assert json.loads((cmd / "index.json").read_text())[0]["started_at"] == "2026-11-30T10:00:00Z"
        assert sorted(p.name for p in (dest / "hosts" / "gpu01").iterdir()) == [
            "commands",
            "facts.json",
            "kernel.log",
            "metrics",
            "units",
        ]
    else:
        with tarfile.open(dest) as tar:
            assert "bundle/hosts/gpu01/facts.json" in tar.getnames()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left


def test_existing_destination_is_refused(tmp_path: Path):
    (tmp_path / "b").mkdir()
    with pytest.raises(Exception, match="already exists"):
        write_bundle(snapshot(), tmp_path / "b")


def hand_bundle(tmp: Path) -> Path:
    """What a colleague sends: a vLLM journal and a kernel log, nothing else."""
    d = tmp / "from-colleague" / "hosts" / "gpu01"
    (d / "units").mkdir(parents=True)
    (d / "kernel.log").write_text(G.fixture("gpu/journal_short_iso_xid.log"))
    (d / "units" / "qwen-a.log").write_text(G.fixture("vllm/startup_fail_kv_cache_exhaustion_v0.11.0.log"))
    return tmp / "from-colleague"


def test_hand_assembled_bundle_runs_checks_with_data_and_the_rest_are_unknown(tmp_path, capsys):
    rc = main(["doctor", "--from", str(hand_bundle(tmp_path)), "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 2
    by_check: dict[str, set[str]] = {}
    for f in doc["findings"]:
        by_check.setdefault(f["check"], set()).add(f["severity"])
    assert "CRIT" in by_check["gpu.xid"] and "CRIT" in by_check["oom.cause"]
    for check in ("gpu.ecc", "gpu.remap", "gpu.lost", "gpu.nvml", "gpu.pcie"):
        assert by_check[check] == {"UNKNOWN"}, check
    kv = next(f for f in doc["findings"] if f["check"] == "oom.cause")
    assert "--max-model-len to at most 20880" in kv["action"]
    assert not any(
        f["severity"] == "OK" and f["check"].startswith("gpu.") and f["check"] != "gpu.xid" for f in doc["findings"]
    )


def test_doctor_from_bundle_with_its_inventory_and_formats(tmp_path, capsys):
    dest = write_bundle(snapshot(), tmp_path / "b.tar.gz", G.INVENTORY)
    assert main(["doctor", "--from", str(dest), "--checks", "remap,tp", "--format", "markdown"]) == 1
    md = capsys.readouterr().out
    assert (
        "| WARN | gpu.remap | gpu01 | gpu:1 | gpu:1 (0000:2a:00.0): a row remap is pending: the GPU keeps working, the remap applies at the next GPU reset |"
        in md
    )
    assert "| WARN | tp.group | - | tp-group:qwen-a | DEGRADED" in md
    assert main(["doctor", "--from", str(dest), "--checks", "remap", "--format", "prom"]) == 1
    assert 'clusterctl_doctor_check_severity{check="gpu.remap",host="gpu01"} 1' in capsys.readouterr().out
    assert main(["doctor", "--from", str(dest)]) == 2
    table = capsys.readouterr().out
    assert table.index("CRIT") < table.index("WARN") and "XID 79" in table


def test_usage_and_bad_input_exit_3_with_the_place(tmp_path, capsys):
    assert main(["doctor", "--from", str(tmp_path / "nope")]) == 3
    assert "no such bundle" in capsys.readouterr().err
    bad = hand_bundle(tmp_path)
    (bad / "hosts" / "gpu01" / "facts.json").write_text('{"gpus": {},\n  "x": oops}\n')
    assert main(["doctor", "--from", str(bad)]) == 3
    err = capsys.readouterr().err
    assert "facts.json:2: not valid JSON" in err and "Traceback" not in err
    assert main(["doctor", "--from", str(bad), "--checks", "gpu,bogus"]) == 3
    assert "unknown check 'bogus'" in capsys.readouterr().err
    assert main(["doctor", "--from", str(bad), "--format", "yaml"]) == 3


# ----------------------------------------------------------------- gather


class MetricsHandler(http.server.BaseHTTPRequestHandler):
    """A serving vLLM's /metrics: 100 more generated tokens at every scrape."""

    scrapes = 0

    def do_GET(self) -> None:  # noqa: N802
        MetricsHandler.scrapes += 1
        body = re.sub(
            r"^(vllm:generation_tokens_total\{[^}]*\}) (\S+)$",
            lambda m: f"{m[1]} {float(m[2]) + 100 * MetricsHandler.scrapes}",
            G.fixture("vllm/metrics_v0.11.0.prom"),
            flags=re.M,
        )
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(autouse=True)
def payload_on_stdin(monkeypatch):
    """LocalFleet swaps the probe inside the shipped program, so the program travels on
    stdin every time (the node cache, clusterctl.fleet.cached, has its own tests)."""
    monkeypatch.setenv("CLUSTERCTL_NODE_CACHE", "off")


class LocalFleet:
    """Runs the real node script here (real python3, http.client, the local journalctl)
    with a stand-in probe payload: a script that prints the host's recorded facts
    (or ``probe_rc`` for hosts listed there)."""

    def __init__(self, hosts, facts, probe_rc=None):
        self.hosts, self.facts, self.warnings, self.calls = hosts, facts, [], []
        self.probe_rc = probe_rc or {}

    def run(
        self, command, *, stdin=None, sudo=False, timeout=None, on_result=None, require_python=False, deadline=None
    ):
        self.calls.append(sorted(command))
        head, _, script = stdin.partition(b"\n")
        assert head.startswith(b"PROBE_PAYLOAD = ") and len(head) > 50_000  # the real payload travels
        rows = []
        for h in self.hosts:
            if h.name not in command:
                continue
            argv = shlex.split(command[h.name])
            assert argv[:4] == ["python3", "-I", "-B", "-"]
            fake = (
                f"import sys; sys.stdout.write({json.dumps(self.facts[h.name])!r} + '\\n'); "
                f"sys.stderr.write('args ' + ' '.join(sys.argv[1:])); sys.exit({self.probe_rc.get(h.name, 0)})"
            )
            stand_in = b"PROBE_PAYLOAD = " + repr(fake.encode()).encode() + b"\n" + script
            p = subprocess.run([sys.executable, *argv[1:]], input=stand_in, capture_output=True, timeout=60)
            row = HostResult(
                h.name,
                HostStatus.OK if p.returncode == 0 else HostStatus.FAILED,
                rc=p.returncode,
                stdout=p.stdout.decode(),
                stderr=p.stderr.decode(),
            )
            if on_result:
                on_result(row)
            rows.append(row)
        return rows


def test_gather_takes_facts_journal_and_two_metrics_samples_in_one_round_trip(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), MetricsHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        inv = G.inventory(
            G.INVENTORY.replace(
                "port: 8000\n    args: {max-model-len: 32768",
                f"port: {server.server_address[1]}\n    args: {{host: 127.0.0.1, max-model-len: 32768",
            )
        )
        hosts = [inv.hosts["gpu01"], inv.hosts["gpu02"]]
        fleet = LocalFleet(hosts, G.healthy())
        snap = gather(fleet, inv, hosts, interval_s=0.4, timeout=10)
    finally:
        server.shutdown()
    assert fleet.calls == [["gpu01", "gpu02"]]  # one round trip: probe and both samples
    assert 0.4 <= snap.interval_s < 2
    assert sorted(snap.facts) == ["gpu01", "gpu02"] and snap.missing == {}
    first, second = snap.raw["gpu01"]["qwen-a.metrics"], snap.raw["gpu01"]["qwen-a.metrics.2"]
    assert first != second and "vllm:num_requests_running" in first and "vllm:num_requests_running" in second
    assert "kernel.log" in snap.raw["gpu01"]
    recs = snap.commands["gpu01"]
    assert any(r.get("argv", [])[:3] == ["journalctl", "-u", "clusterctl-qwen-a.service"] for r in recs)
    assert sum(1 for r in recs if r.get("url", "").endswith(f":{server.server_address[1]}/metrics")) == 2
    # qwen-b's server is not running: its failed scrape is recorded, not raised
    assert any("error" in r for r in recs if r.get("url", "").endswith(":8001/metrics"))
    findings = run_analyzers(context(snap, inv, G.ctx().thresholds), only=["serving.metrics"])
    assert [(f.subject, f.severity) for f in findings] == [("instance:qwen-a", Severity.OK)]


def test_gather_passes_the_probe_arguments_and_reports_a_failed_probe_as_missing():
    inv = G.inventory(G.INVENTORY)
    hosts = [inv.hosts["gpu01"], inv.hosts["gpu02"]]
    fleet = LocalFleet(hosts, G.healthy(), probe_rc={"gpu02": 97})
    seen = []
    snap = gather(fleet, inv, hosts, interval_s=0, timeout=10, raw_outputs=True, on_facts=seen.append)
    assert sorted(snap.facts) == ["gpu01"]
    assert "gpu02" in snap.missing and "args --nvml-budget 6.0 --raw-outputs" in snap.missing["gpu02"]
    assert sorted((r.host, r.ok) for r in seen) == [("gpu01", True), ("gpu02", False)]
    assert "qwen-a.metrics.2" not in snap.raw.get("gpu01", {})  # interval 0: one sample


def test_collect_refuses_an_existing_output_before_connecting(tmp_path, capsys):
    inv = write_inventory(tmp_path)
    (tmp_path / "out").mkdir()
    assert main(["collect", "all", "-i", str(inv), "-o", str(tmp_path / "out")]) == 3
    assert "already exists" in capsys.readouterr().err


def test_api_keys_in_vllm_logs_are_redacted_before_they_are_saved():
    from clusterctl.diagnose.bundle import redact

    line = (
        "(APIServer pid=7140) INFO 11-30 10:02:13 [utils.py:233] non-default args: {'model_tag': 'q', "
        "'api_key': ['sk-secret-1', 'sk-secret-2'], 'port': 8000}"
    )
    assert "sk-secret" not in redact(line) and "'api_key': '***'" in redact(line)
    assert "sk-x" not in redact("args: Namespace(model='q', api_key='sk-x', port=8000)")
    assert "sk-y" not in redact("ExecStart=vllm serve q --api-key sk-y --port 8000")
    assert "sk-z" not in redact("Environment=VLLM_API_KEY=sk-z")
    assert redact("Using max model len 40960") == "Using max model len 40960"


def test_collector_raw_outputs_are_opt_in_and_verbatim():
    collector = Path(__file__).resolve().parents[3] / "clusterctl" / "node" / "collector.py"
    args = [sys.executable, str(collector), "--nvml-budget", "2", "--cmd-timeout", "5"]
    plain = json.loads(subprocess.run(args, capture_output=True, text=True, timeout=60).stdout)
    assert "raw_outputs" not in plain
    doc = json.loads(subprocess.run(args + ["--raw-outputs"], capture_output=True, text=True, timeout=60).stdout)
    raw = doc["raw_outputs"]
    assert isinstance(raw, list)
    for rec in raw:
        assert set(rec) == {"argv", "rc", "stdout", "stderr", "started_at", "duration_s"}
    journal = [r for r in raw if r["argv"][:2] == ["journalctl", "-k"]]
    if shutil.which("journalctl"):  # verbatim: the same command prints the same bytes
        again = subprocess.run(
            journal[0]["argv"],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0", "LC_ALL": "C"},
        )
        assert journal[0]["rc"] == again.returncode and journal[0]["stderr"] == again.stderr


def test_doctor_from_a_bundle_for_some_hosts_only(tmp_path, capsys):
    dest = write_bundle(snapshot(), tmp_path / "b", G.INVENTORY)
    assert main(["doctor", "gpu02", "--from", str(dest), "--json", "--checks", "gpu.remap,gpu.xid"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {f["host"] for f in doc["findings"]} == {"gpu02"}
    assert main(["doctor", "nohost", "--from", str(dest)]) == 3
    assert "unknown host(s): nohost" in capsys.readouterr().err
    hand = hand_bundle(tmp_path)  # no inventory: node-set names
    assert main(["doctor", "gpu[02-09]", "--from", str(hand)]) == 3
    assert "selects no host of the bundle" in capsys.readouterr().err
