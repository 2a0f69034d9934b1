"""collect_facts over a stand-in fleet, and the typed view of the document."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from clusterctl.errors import ProbeError
from clusterctl.fleet.results import HostResult, HostStatus, RunResults
from clusterctl.inventory.model import Host
from clusterctl.node import collector
from clusterctl.probe.facts import SCHEMA, parse_facts
from clusterctl.probe.factgroups import GpusFact, HostFact, KernelLogFact, NicsFact, RdmaPrereqsFact, UnitsFact
from clusterctl.probe.payload import RC_PYTHON_TOO_OLD, payload
from clusterctl.probe.run import OK, UNKNOWN, collect_facts, interpret

from probe_fakes import collector_args, h100


def local_facts_json() -> str:
    """A real facts document of this machine."""
    r = subprocess.run(
        [sys.executable, "-I", "-B", "-"], input=payload().data, capture_output=True, timeout=60, check=True
    )
    return r.stdout.decode()


class StubFleet:
    """Answers ``run`` with canned rows and records what it was asked."""

    def __init__(self, rows: dict[str, HostResult]):
        self.hosts = [Host(name=n, address="127.0.0.1") for n in rows]
        self.rows = rows
        self.calls: list[dict] = []

    def run(self, command, *, stdin=None, sudo=False, timeout=None, on_result=None, require_python=False):
        self.calls.append(
            {"command": command, "stdin": stdin, "sudo": sudo, "timeout": timeout, "require_python": require_python}
        )
        for r in self.rows.values():
            if on_result:
                on_result(r)
        return RunResults(list(self.rows.values()))


def row(
    host: str, status: HostStatus, rc: int | None = 0, stdout: str = "", stderr: str = "", error: str | None = None
) -> HostResult:
    return HostResult(host, status, rc=rc, stdout=stdout, stderr=stderr, duration_s=0.5, error=error)


def test_one_result_per_host_whatever_happened():
    good = local_facts_json()
    newer = json.dumps(dict(json.loads(good), schema=SCHEMA + 1))
    fleet = StubFleet(
        {
            "gpu01": row("gpu01", HostStatus.OK, stdout=good),
            "gpu02": row("gpu02", HostStatus.NO_PYTHON, rc=127, error="python3 is not installed (or not on PATH)"),
            "gpu03": row("gpu03", HostStatus.UNREACHABLE, rc=None, error="connection refused"),
            "gpu04": row(
                "gpu04",
                HostStatus.FAILED,
                rc=RC_PYTHON_TOO_OLD,
                stderr="clusterctl probe: python 3.6.8 is too old, 3.8 or newer is needed\n",
            ),
            "gpu05": row("gpu05", HostStatus.OK, stdout="Welcome to gpu05!\n"),
            "gpu06": row("gpu06", HostStatus.OK, stdout=newer),
            "gpu07": row("gpu07", HostStatus.TIMEOUT, rc=None, error="command timed out after 90 s"),
            "gpu08": row("gpu08", HostStatus.FAILED, rc=1, stderr="Traceback...\nMemoryError\n"),
        }
    )
    seen = []
    res = collect_facts(fleet, kernel_log_cursor="s=1;i=2", timeout=30, on_result=seen.append)
    assert list(res) == [f"gpu0{i}" for i in range(1, 9)]
    assert [r.host for r in seen] == list(res)
    assert res["gpu01"].status == OK and res["gpu01"].facts.schema == 1
    assert all(r.status == UNKNOWN for h, r in res.items() if h != "gpu01")
    assert res["gpu02"].reason.startswith("python3 is not installed on the node")
    assert res["gpu02"].fleet_status == "no_python"
    assert res["gpu03"].reason == "connection refused"
    assert res["gpu04"].reason == "clusterctl probe: python 3.6.8 is too old, 3.8 or newer is needed"
    assert "not a JSON document" in res["gpu05"].reason and res["gpu05"].reason.startswith("gpu05:")
    assert "newer than this clusterctl understands" in res["gpu06"].reason
    assert res["gpu07"].reason == "command timed out after 90 s"
    assert res["gpu08"].reason == "the probe exited with rc 1: MemoryError"
    (call,) = fleet.calls  # no host said "not cached": one round trip, nothing on stdin
    assert call["stdin"] is None and call["require_python"] is True
    assert call["timeout"] == 30
    assert call["command"]["gpu01"].endswith(f"{payload().digest} run --kernel-log-cursor 's=1;i=2' --nvml-budget 18.0")
    # without the node cache the payload goes on stdin, as before
    fleet.calls.clear()
    collect_facts(fleet, kernel_log_cursor="s=1;i=2", timeout=30, cache=False)
    assert fleet.calls[0]["stdin"] == payload().data
    assert fleet.calls[0]["command"]["gpu01"].startswith("python3 -I -B - --kernel-log-cursor 's=1;i=2'")


def test_banner_before_the_document_is_ignored():
    res = interpret(row("h", HostStatus.OK, stdout="pyenv: welcome\n" + local_facts_json()))
    assert res.status == OK and res.facts.schema == 1


def test_per_host_cursors():
    fleet = StubFleet(
        {
            "a": row("a", HostStatus.UNREACHABLE, rc=None, error="x"),
            "b": row("b", HostStatus.UNREACHABLE, rc=None, error="x"),
        }
    )
    collect_facts(fleet, kernel_log_cursor={"a": "file:/var/log/kern.log:12:345"})
    cmd = fleet.calls[0]["command"]
    assert "--kernel-log-cursor file:/var/log/kern.log:12:345" in cmd["a"]
    assert "--kernel-log-cursor" not in cmd["b"]


def test_to_dict_is_the_document_or_the_reason():
    good = interpret(row("h", HostStatus.OK, stdout=local_facts_json()))
    assert good.to_dict()["schema"] == 1
    bad = interpret(row("h", HostStatus.AUTH_FAILED, rc=None, error="the server refused every key"))
    assert bad.to_dict() == {
        "status": "unknown",
        "reason": "the server refused every key",
        "fleet_status": "auth_failed",
    }


def fake_doc(fake_nvml) -> dict:
    lost = h100(1)
    lost["nvmlDeviceGetMemoryInfo"] = __import__("probe_fakes").NVMLError(15)
    fake_nvml([h100(0), lost])
    return collector.collect(collector_args())


def test_typed_view(fake_nvml):
    facts = parse_facts(json.dumps(fake_doc(fake_nvml)))
    assert facts.gpus.available and len(facts.gpus.devices) == 2
    g0 = facts.gpus.devices[0]
    assert g0.memory_used == 70 * 1024**3 and g0.processes[0].pid == 4242 and g0.ok
    assert g0.remapped_rows is not None and g0.remapped_rows.correctable == 2
    assert [g.index for g in facts.gpus.lost] == [1]
    assert facts.boot_id and facts.kernel_log is not None


@pytest.mark.parametrize(
    "text,message",
    [
        ("not json", "not a JSON document"),
        ("[1, 2]", "expected a JSON object, got list"),
        ('{"host": {}}', "no schema version"),
        ('{"schema": 99}', "facts schema 99 is newer than this clusterctl understands (1); upgrade clusterctl"),
        ('{"schema": 1, "collected_at": "x", "host": {}}', "malformed facts document (schema 1): KeyError"),
    ],
)
def test_bad_documents_raise_clear_probe_errors(text, message):
    with pytest.raises(ProbeError) as e:
        parse_facts(text, origin="gpu01: probe output")
    assert str(e.value).startswith("gpu01: probe output: ")
    assert message in str(e.value)


def test_facts_is_the_fact_groups_of_the_document(fake_nvml):
    doc = fake_doc(fake_nvml)
    facts = parse_facts(json.dumps(doc))
    # one typed view: pre-flight's Facts and the analyzers' groups read the same document the same way
    assert facts.gpus == GpusFact.parse(doc) and facts.nics == NicsFact.parse(doc).nics
    assert facts.host == HostFact.parse(doc) and facts.kernel_log == KernelLogFact.parse(doc)
    assert facts.units == (UnitsFact.parse(doc).units if doc["units"] is not None else None)
    assert facts.group(RdmaPrereqsFact) == RdmaPrereqsFact.parse(doc)
    assert facts.hostname == doc["host"]["hostname"] and facts.host.mem_available == doc["host"]["memory"]["available"]


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda d: d["gpus"]["devices"].append({"name": "x"}), "gpus.devices[2] has no integer index"),
        (lambda d: d["gpus"]["devices"][0].update(processes=[{"used_memory": 1}]), "processes[0] has no integer pid"),
        (lambda d: d.update(nics={"eth0": {}}), "nics is not a list"),
        (lambda d: d.update(nics=["eth0"]), "nics[0] is not an object"),
        (lambda d: d.update(units=[{"active_state": "active"}]), "units[0] has no unit name"),
        (lambda d: d["gpus"].pop("available"), "KeyError: 'gpus.available'"),
    ],
)
def test_entries_the_typed_view_would_drop_are_a_clear_probe_error(fake_nvml, change, message):
    doc = fake_doc(fake_nvml)
    change(doc)
    with pytest.raises(ProbeError, match="gpu01: probe output: malformed facts document") as e:
        parse_facts(doc, origin="gpu01: probe output")
    assert message in str(e.value)
