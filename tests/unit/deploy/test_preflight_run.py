"""run_preflight's wiring: the node reader's real output through a fake fleet, given facts,
unreachable hosts as rows; the node reader's error paths."""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import sys
import struct
from pathlib import Path
from typing import Any

from clusterctl.node import preflight as preflight_node
from clusterctl.deploy.preflight.kvcheck import KvCheck, read_kv_checks
from clusterctl.deploy.preflight.memory import MiB
from clusterctl.deploy.preflight.checks import run_preflight
from clusterctl.fleet import ship
from clusterctl.fleet.results import HostResult, HostStatus, RunResults
from clusterctl.inventory.model import GpuRef, Host, Instance
from clusterctl.probe.facts import parse_facts
from unit.deploy.preflight_helpers import FIXTURES, inventory, make_sparse


def _facts(processes: list[dict[str, Any]] | None = None) -> Any:
    dev = [
        {
            "index": i,
            "name": "NVIDIA H100 80GB HBM3",
            "memory_total": 81559 * MiB,
            "memory_used": 516 * MiB,
            "memory_free": 81043 * MiB,
            "processes": [],
        }
        for i in range(8)
    ]
    if processes:
        dev[0]["processes"] = processes
        held = sum(p["used_memory"] for p in processes)
        dev[0]["memory_used"] += held
        dev[0]["memory_free"] -= held
    return parse_facts(
        {
            "schema": 1,
            "collected_at": "2026-11-30T15:00:00Z",
            "host": {},
            "gpus": {"available": True, "devices": dev},
            "nics": [],
        }
    )


class FakeFleet:
    """Answers the node reader by running it here, with a recorded `ss` output instead of the real one."""

    def __init__(self, hosts: list[Host], model_dirs: dict[str, str], ss: str, down: set[str] = frozenset()):
        self.hosts, self.model_dirs, self.ss, self.down = hosts, model_dirs, ss, down
        self.engine_paths: dict[str, str] = {}
        self.commands: list[Any] = []

    def run(self, command: Any, **kw: Any) -> RunResults:
        out = RunResults()
        # The probe (one command, or one per host through clusterctl.fleet.cached): only the down host matters here.
        if isinstance(command, str) or '"models"' not in " ".join(command.values()):
            for h in self.hosts:
                out.add(
                    HostResult(
                        h.name,
                        HostStatus.UNREACHABLE if h.name in self.down else HostStatus.FAILED,
                        rc=None if h.name in self.down else 1,
                        error="connection refused",
                    )
                )
            return out
        self.commands.append((command, kw))
        for h, cmd in command.items():
            if h in self.down:
                out.add(HostResult(h, HostStatus.UNREACHABLE, error="connection refused"))
                continue
            req = json.loads(shlex.split(cmd)[-1])  # the request: the program's one argument
            doc = {
                "models": {p: preflight_node.model_sizes(self.model_dirs.get(p, p)) for p in req["models"]},
                "listeners": {"ss": self.ss, "error": None},
                "pid_units": {"1733": "run-u9.service"},
                "engines": {
                    p: preflight_node.engine_state(self.engine_paths.get(p, p)) for p in req.get("engines", [])
                },
            }
            out.add(HostResult(h, HostStatus.OK, rc=0, stdout=json.dumps(doc)))
        return out


def test_run_preflight_reads_through_the_fleet(tmp_path: Path) -> None:
    inv = inventory()
    inv.hosts["gpu02"] = Host("gpu02", "10.0.0.2", gpus=inv.hosts["gpu01"].gpus)
    model = tmp_path / "qwen3-8b"
    make_sparse("Qwen3-8B", model)
    insts = {
        "a": Instance(
            "a",
            "qwen3-8b",
            "vllm-0.11",
            (GpuRef("gpu01", 0),),
            8000,
            args={"gpu-memory-utilization": 0.9, "max-model-len": 8192},
        ),
        "b": Instance("b", "qwen3-8b", "vllm-0.11", (GpuRef("gpu01", 1),), 8001, args={"max-model-len": 8192}),
        "c": Instance("c", "qwen3-8b", "vllm-0.11", (GpuRef("gpu02", 0),), 8000, args={}),
    }
    ss = (FIXTURES / "ss_foreign_http_server.txt").read_text().replace(":8000 ", ":8001 ")
    fleet = FakeFleet([inv.hosts["gpu01"], inv.hosts["gpu02"]], {"/models/qwen3-8b": str(model)}, ss, down={"gpu02"})
    fleet.engine_paths = {"/opt/vllm-0.11/bin/vllm": sys.executable}  # installed there
    other = {"pid": 4242, "used_memory": 40 * 1024 * MiB, "name": "python", "unit": "train.service"}
    events: list[str] = []
    rep = run_preflight(inv, insts, fleet, facts={"gpu01": _facts([other])}, on_event=events.append)
    # One reader run for both hosts, as root, the reader shipped the one way (from the node cache here).
    [(cmd, kw)] = fleet.commands
    reader = ship.build("preflight")
    assert b"safetensors" in reader.data
    assert set(cmd) == {"gpu01", "gpu02"} and kw["sudo"] is True and all(reader.digest in c for c in cmd.values())
    assert [p.check for p in rep.row("a").problems] == ["gpu.free"]  # 40 GiB held by train.service
    assert "train.service" in rep.row("a").problems[0].message
    assert [p.check for p in rep.row("b").problems] == ["port.taken"]  # python3 pid 1733 on 8001
    assert "run-u9.service" in rep.row("b").problems[0].message
    c = rep.row("c").problems
    assert [p.check for p in c] == ["host.unreadable"] and "connection refused" in c[0].message
    assert rep.row("a").weights_source == "safetensors" and rep.refused == ["a", "b", "c"]
    assert events[-1] == "pre-flight: 3 instance(s), 3 refused"
    assert json.loads(json.dumps(rep.to_json()))["refused"] == ["a", "b", "c"]


def test_preflight_names_the_host_that_lacks_the_engine(tmp_path: Path) -> None:
    inv = inventory()
    inv.hosts["gpu02"] = Host("gpu02", "10.0.0.2", gpus=inv.hosts["gpu01"].gpus)
    model = tmp_path / "qwen3-8b"
    make_sparse("Qwen3-8B", model)
    insts = {
        h: Instance(h, "qwen3-8b", "vllm-0.11", (GpuRef(h, 0),), 8000, args={"max-model-len": 8192})
        for h in ("gpu01", "gpu02")
    }
    fleet = FakeFleet([inv.hosts["gpu01"], inv.hosts["gpu02"]], {"/models/qwen3-8b": str(model)}, "")
    # one reader for both hosts: the engine resolves to an executable here, to a missing path there
    engine = tmp_path / "vllm"
    engine.write_text("#!/bin/sh\n")
    engine.chmod(0o755)
    fleet.engine_paths = {"/opt/vllm-0.11/bin/vllm": str(engine)}
    rep = run_preflight(inv, insts, fleet, facts={"gpu01": _facts([]), "gpu02": _facts([])})
    [(cmd, _)] = fleet.commands
    assert all("/opt/vllm-0.11/bin/vllm" in c for c in cmd.values())
    assert rep.refused == [] and all("engine.missing" not in [p.check for p in r.problems] for r in rep.rows)
    engine.unlink()
    fleet.commands.clear()
    rep = run_preflight(inv, insts, fleet, facts={"gpu01": _facts([]), "gpu02": _facts([])})
    assert rep.refused == ["gpu01", "gpu02"]
    for h in ("gpu01", "gpu02"):
        [p] = [p for p in rep.row(h).problems if p.check == "engine.missing"]
        assert f"is not installed on {h}: no /opt/vllm-0.11/bin/vllm" in p.message and p.numbers["host"] == h


def test_node_reader_engine_state(tmp_path: Path) -> None:
    exe, plain = tmp_path / "vllm", tmp_path / "plain"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    plain.write_text("")
    assert preflight_node.engine_state(str(exe)) == {"exists": True, "executable": True}
    assert preflight_node.engine_state(str(plain)) == {"exists": True, "executable": False}
    assert preflight_node.engine_state(str(tmp_path)) == {"exists": True, "executable": False}  # a directory
    assert preflight_node.engine_state(str(tmp_path / "nope")) == {"exists": False, "executable": False}


def _header(path: Path, header: bytes) -> None:
    path.write_bytes(struct.pack("<Q", len(header)) + header)


def test_node_reader_errors_name_the_file(tmp_path: Path) -> None:
    assert "config.json" in preflight_node.model_sizes(str(tmp_path / "nope"))["error"]
    (tmp_path / "config.json").write_text("{}")
    assert "no *.safetensors" in preflight_node.model_sizes(str(tmp_path))["error"]
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40))
    assert "not plausible" in preflight_node.model_sizes(str(tmp_path))["error"]
    _header(tmp_path / "model.safetensors", b'{"a": {"dtype": "BF16", "shape": [2]}}')
    assert "model.safetensors" not in preflight_node.model_sizes(str(tmp_path)).get("weights", {})
    assert "data_offsets" in preflight_node.model_sizes(str(tmp_path))["error"]


def test_node_reader_classifies_tensors(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    tensors = {
        "__metadata__": {"format": "pt"},
        "model.embed_tokens.weight": {"dtype": "BF16", "shape": [100, 8], "data_offsets": [0, 1600]},
        "model.layers.0.input_layernorm.weight": {"dtype": "BF16", "shape": [8], "data_offsets": [0, 16]},
        "model.layers.0.self_attn.k_proj.weight": {"dtype": "BF16", "shape": [4, 8], "data_offsets": [0, 64]},
        "model.layers.0.self_attn.k_proj.bias": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 8]},
        "model.layers.0.mlp.down_proj.weight": {"dtype": "BF16", "shape": [8, 8], "data_offsets": [0, 128]},
        "model.layers.0.mlp.down_proj.qzeros": {"dtype": "I32", "shape": [1, 1], "data_offsets": [0, 4]},
    }
    _header(tmp_path / "model.safetensors", json.dumps(tensors).encode())
    w = preflight_node.model_sizes(str(tmp_path))["weights"]
    assert w == {"replicated": 16, "split": 4, "split_linear": 128, "kv": 8, "kv_linear": 64, "vocab": [[100, 1600]]}


def test_node_reader_main_prints_one_json_document(tmp_path: Path) -> None:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert preflight_node.main(["-", json.dumps({"models": [str(tmp_path)], "ports": True})]) == 0
    doc = json.loads(buf.getvalue())
    assert "error" in doc["models"][str(tmp_path)]
    assert "listeners" in doc and isinstance(doc["pid_units"], dict)


class JournalFleet:
    """Answers read_kv_checks' per-host command with recorded journal lines."""

    def __init__(self, answers: dict[str, HostResult]):
        self.answers, self.commands = answers, {}

    def run(self, command: dict[str, str], **kw: Any) -> RunResults:
        self.commands = command
        return RunResults([self.answers[h] for h in command])


def test_read_kv_checks_per_instance_from_each_host() -> None:
    sample = (FIXTURES.parent / "vllm" / "startup_success_v0.11.0.log").read_text().splitlines()
    kept = [ln for ln in sample if "GPU KV cache size" in ln or "non-default args" in ln]
    out = "=== clusterctl-kvcheck a\n" + "\n".join(kept) + "\n=== clusterctl-kvcheck b\n"
    fleet = JournalFleet(
        {
            "gpu01": HostResult("gpu01", HostStatus.OK, rc=0, stdout=out),
            "gpu02": HostResult("gpu02", HostStatus.UNREACHABLE, error="no route to host"),
        }
    )
    checks = read_kv_checks(fleet, {"a": ("gpu01", 311_000), "b": ("gpu01", 5), "c": ("gpu02", 7)})
    assert "journalctl -u clusterctl-a.service" in fleet.commands["gpu01"]
    a, b, c = checks["a"], checks["b"], checks["c"]
    assert isinstance(a, KvCheck) and a.logged == 311_040 and a.per_rank == (311_040, 311_616)
    assert isinstance(b, KvCheck) and b.logged is None  # still loading: no KV line yet
    assert c == "gpu02: unreachable: no route to host"


def test_node_reader_is_python38_stdlib_only() -> None:
    import ast
    import sys as _sys

    src = Path(preflight_node.__file__).read_text()
    tree = ast.parse(src, feature_version=(3, 8))  # no newer syntax (match, X | Y at runtime, ...)
    mods = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert mods <= set(_sys.stdlib_module_names), mods - set(_sys.stdlib_module_names)


def test_the_facts_and_the_node_reader_run_at_once(tmp_path: Path) -> None:
    """The node reader's request does not depend on the facts: its fan-out round starts while the
    facts' is still running (each round here waits up to 5 s for the other to have started)."""
    import threading

    class Overlapping(FakeFleet):
        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.probing, self.reading = threading.Event(), threading.Event()
            self.saw: dict[str, bool] = {}

        def run(self, command: Any, **kw: Any) -> RunResults:
            reader = not isinstance(command, str) and '"models"' in " ".join(command.values())
            (self.reading if reader else self.probing).set()
            other = self.probing if reader else self.reading
            self.saw.setdefault("reader saw the probe" if reader else "probe saw the reader", other.wait(5))
            return super().run(command, **kw)

    inv = inventory()
    model = tmp_path / "qwen3-8b"
    make_sparse("Qwen3-8B", model)
    insts = {"a": Instance("a", "qwen3-8b", "vllm-0.11", (GpuRef("gpu01", 0),), 8000, args={"max-model-len": 8192})}
    fleet = Overlapping([inv.hosts["gpu01"]], {"/models/qwen3-8b": str(model)}, "")
    events: list[str] = []
    rep = run_preflight(inv, insts, fleet, on_event=events.append)
    assert fleet.saw == {"reader saw the probe": True, "probe saw the reader": True}
    assert events[:2] == [
        "pre-flight: reading GPU facts on 1 host(s)",
        "pre-flight: reading model sizes and listening ports on 1 host(s)",
    ]
    # the probe's answer still reaches the view once both rounds are done: no facts for gpu01, and why
    gpu = [p.message for p in rep.row("a").problems if p.check == "gpu.facts"]
    assert len(gpu) == 1 and gpu[0].startswith("GPU facts: the probe exited with rc 1")
