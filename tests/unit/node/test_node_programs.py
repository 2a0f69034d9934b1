"""Every program that runs on a node (``clusterctl/node/``) on the nodes' minimum Python.

The nodes need Python 3.8 or newer (docs/facts.md).  The programs clusterctl runs on a node
run here the one way they are shipped (``clusterctl.fleet.ship``: built by ``ship.build``,
through the node cache's loader: first shipped on stdin and stored, then from the cached
copy, the job on stdin); the installed scripts run as the files they are installed as.  All
of it on the oldest Python 3.8 this machine has (pyenv's), else on this interpreter; vermin
checks the source for anything newer than 3.8 either way.  Each must import only the standard
library and ``clusterctl/node`` itself: they are imported on that interpreter with ``-S`` (no
site-packages at all), and every module then loaded must come from its standard library or
from ``clusterctl/node``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from clusterctl import node
from clusterctl.deploy.preflight.hosts import NODE_SCRIPT as PREFLIGHT
from clusterctl.deploy.remote import node_program as deploy_program
from clusterctl.probe.snapshot import node_program as bundle_program
from clusterctl.fleet import ship
from clusterctl.fleet.cached import loader_command
from clusterctl.probe.payload import payload
from clusterctl.stage import bundle as stage_bundle

PYENV = Path("/root/.pyenv/versions")
REPO = Path(__file__).resolve().parents[3]
NODE_DIR = REPO / "clusterctl" / "node"
MIN = (3, 8)


def _oldest_supported_python() -> str:
    """Python 3.8 when this machine has it (pyenv), else this interpreter."""
    for p in sorted(PYENV.glob("3.8*/bin/python3.8")):
        return str(p)
    return sys.executable


PY = _oldest_supported_python()


def _modules() -> list[str]:
    return sorted(
        ".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__") for p in NODE_DIR.rglob("*.py")
    )


def test_every_node_program_is_known_to_this_test() -> None:
    """A new program in clusterctl/node/ must get a run below (and a line in its docstring)."""
    programs = {m.removeprefix("clusterctl.node.") for m in _modules()} - {"clusterctl.node", "stage"}
    assert programs == set(RUNS) | {
        "stage.manifest",
        "stage.layout",
        "stage.fetch",
        "stage.s3",
        "stage.relay",
        "stage.pagecache",
        "stage.threads",
    }


def test_node_programs_need_nothing_newer_than_python38() -> None:
    vermin = shutil.which("vermin")
    assert vermin, "vermin is a test dependency (pip install -e .[test])"
    out = subprocess.run(
        [vermin, f"-t={MIN[0]}.{MIN[1]}-", "--no-tips", "--violations", str(NODE_DIR)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_node_programs_import_on_the_oldest_python_from_the_stdlib_alone() -> None:
    code = (
        "import importlib, json, sys, sysconfig\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "for m in json.loads(sys.argv[2]): importlib.import_module(m)\n"
        "std = (sysconfig.get_paths()['stdlib'], sysconfig.get_paths()['platstdlib'])\n"
        "bad = sorted('%s (%s)' % (n, getattr(m, '__file__', None)) for n, m in list(sys.modules.items())\n"
        "             if getattr(m, '__file__', None) and not m.__file__.startswith(std)\n"
        "             and not m.__file__.startswith(sys.argv[3]) and n != 'clusterctl')\n"
        "print(json.dumps({'version': list(sys.version_info[:2]), 'outside': bad}))\n"
    )
    r = subprocess.run(
        [PY, "-I", "-S", "-B", "-c", code, str(REPO), json.dumps(_modules()), str(NODE_DIR)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert tuple(doc["version"]) >= MIN
    if PY != sys.executable:
        assert tuple(doc["version"]) == MIN
    assert doc["outside"] == []


def _run(args: list[str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, *args], input=stdin, capture_output=True, text=True, timeout=60, cwd="/")


def _json_line(r: subprocess.CompletedProcess[str]) -> dict:
    assert r.stderr == "", r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1, r.stdout
    return json.loads(lines[0])


def _shipped(
    tmp: Path, program: ship.Program, args: list[str], job: str = ""
) -> list[subprocess.CompletedProcess[str]]:
    """``program`` run as ``ship.run`` runs it, on the oldest Python: shipped and stored (the
    program, then the job, on stdin), then run again from the node cache (the job alone)."""
    env = {"PATH": "/usr/bin:/bin", "CLUSTERCTL_NODE_CACHE_DIR": str(tmp / "cache")}
    out = []
    for mode, head in ((f"store={len(program)}", program.data), ("run", b"")):
        r = subprocess.run(
            ["/bin/sh", "-c", loader_command(program.digest, mode, args, python=PY)],
            input=head + job.encode(),
            capture_output=True,
            timeout=60,
            cwd="/",
            env=env,
        )
        out.append(subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(), r.stderr.decode()))
    assert (tmp / "cache" / f"{program.digest}.py").read_bytes() == program.data
    return out


def run_collector(tmp: Path) -> None:  # the probe's payload (collector + carried pynvml)
    p = payload()
    for r in _shipped(tmp, ship.Program("collector", p.data, p.digest), ["--help"]):
        assert r.returncode == 0 and "--kernel-log-cursor" in r.stdout, r.stderr


def run_deploy(tmp: Path) -> None:  # deploy/remote.py's program, the job on stdin
    for r in _shipped(tmp, deploy_program(), [], json.dumps({"op": "no-such-op"}) + "\n"):
        assert _json_line(r) == {"ok": False, "kind": "node", "error": "KeyError: 'no-such-op'"}


def run_gateway(tmp: Path) -> None:  # gateway/deploy.py's, the host's name as argument
    program = ship.build("gateway")
    for r in _shipped(tmp, program, ["gw1"], json.dumps({"op": "no-such-op"}) + "\n"):
        assert _json_line(r) == {"ok": False, "kind": "node", "error": "KeyError: 'no-such-op'"}


def run_preflight(tmp: Path) -> None:  # deploy/preflight/hosts.py's, the request as argument
    program = ship.build("preflight", PREFLIGHT.read_bytes())
    for r in _shipped(tmp, program, [json.dumps({"models": [str(tmp / "absent")]})]):
        assert r.returncode == 0, r.stderr
        assert "config.json" in json.loads(r.stdout)["models"][str(tmp / "absent")]["error"]


def run_bundle(tmp: Path) -> None:  # probe/snapshot.py's (no probe, no instance asked)
    for r in _shipped(tmp, bundle_program(b""), [json.dumps({"instances": {}})]):
        doc = _json_line(r)
        assert doc["instances"] == {} and doc["collected_at"]


def _installed_by_script(tmp: Path, name: str) -> Path:
    """Node program ``name`` written as deploy's node set-up writes it (ship.install_script)."""
    program = ship.installed(name)
    dest = tmp / "lib" / ship.INSTALLED[name]
    subprocess.run(["/bin/sh", "-c", ship.install_script(program, str(dest))], check=True, timeout=60)
    assert dest.read_bytes() == program.data == node.path(name).read_bytes()
    return dest


def _installed_by_staging(tmp: Path, name: str) -> Path:
    """Node program ``name`` written as staging's node program writes it (its ``install`` job, the
    staging program itself run through the loader, shipped then cached)."""
    program = ship.installed(name)
    dest = tmp / "lib" / ship.INSTALLED[name]
    job = json.dumps(dict(op="install", **ship.install_job(program, str(dest)))) + "\n"
    for r in _shipped(tmp, stage_bundle.program(), [], job):
        assert _json_line(r)["ok"] is True
    assert dest.read_bytes() == program.data == node.path(name).read_bytes()
    return dest


def run_check_gpus(tmp: Path) -> None:  # installed as the units' ExecStartPre; no NVML here: a refusal
    r = _run([str(_installed_by_script(tmp, "check_gpus")), "--list"])
    if r.returncode == 0:  # a machine with a GPU lists it
        assert r.stderr == ""
    else:
        assert r.returncode == 1 and r.stderr.startswith("check-gpus: refusing to start:"), r.stderr


def run_stage_main(tmp: Path) -> None:  # the staging package (stage/bundle.py)
    for r in _shipped(tmp, stage_bundle.program(), [], json.dumps({"op": "no-such-op"}) + "\n"):
        assert r.returncode == 1
        doc = _json_line(r)
        assert doc["ok"] is False and doc["kind"] == "manifest" and "no-such-op" in doc["error"]


def run_stage_verify_model(tmp: Path) -> None:  # installed as verify-model (by deploy and by staging)
    for dest in (
        _installed_by_script(tmp / "deploy", "stage/verify_model"),
        _installed_by_staging(tmp, "stage/verify_model"),
    ):
        r = _run([str(dest), str(tmp / "absent")])
        assert r.returncode == 1 and r.stderr.startswith("verify-model: refusing to start:"), r.stderr


def run_stage_pin_model(tmp: Path) -> None:  # installed as pin-model (by staging's pin)
    r = _run([str(_installed_by_staging(tmp, "stage/pin_model")), str(tmp / "absent"), "--budget", "1"])
    assert r.returncode == 1 and "is not a staged model" in r.stderr, r.stderr


RUNS = {
    "collector": run_collector,
    "deploy": run_deploy,
    "gateway": run_gateway,
    "preflight": run_preflight,
    "bundle": run_bundle,
    "check_gpus": run_check_gpus,
    "stage.main": run_stage_main,
    "stage.verify_model": run_stage_verify_model,
    "stage.pin_model": run_stage_pin_model,
}


@pytest.mark.parametrize("program", sorted(RUNS))
def test_each_node_program_runs_on_the_oldest_python(program: str, tmp_path: Path) -> None:
    RUNS[program](tmp_path)


def test_the_installed_programs_are_every_file_systemd_runs() -> None:
    """The node programs installed as files (not run by clusterctl) are the builder's, one file
    each with its interpreter line (systemd runs the file), and exactly the programs this test
    runs as installed files."""
    assert set(ship.INSTALLED) == {"check_gpus", "stage/verify_model", "stage/pin_model"}
    for name in ship.INSTALLED:
        program = ship.installed(name)
        assert (
            program.data.startswith(b"#!/usr/bin/env python3\n")
            and program.digest == hashlib.sha256(program.data).hexdigest()
        )
    with pytest.raises(ValueError, match="not an installed node program"):
        ship.installed("collector")


def test_an_installed_program_is_written_only_when_it_changed_and_never_damaged(tmp_path: Path) -> None:
    """Both writers (deploy's set-up script, staging's install job): a file that already has the
    program's sha256 is left alone; another one is replaced whole; bytes that do not have the
    sha256 they were sent with are refused and nothing is written."""
    program = ship.installed("stage/verify_model")
    damaged = ship.Program(program.name, program.data + b"# changed on the way\n", program.digest)
    for writer in ("script", "job"):
        dest = tmp_path / writer / "verify-model"

        def write(p: ship.Program) -> tuple[int, str]:
            if writer == "script":
                r = subprocess.run(["/bin/sh", "-c", ship.install_script(p, str(dest))], capture_output=True, text=True)
                return r.returncode, r.stderr
            job = json.dumps(dict(op="install", **ship.install_job(p, str(dest))))
            out = subprocess.run(
                [PY, "-I", "-B", "-c", stage_bundle.bootstrap()],
                input=job + "\n",
                capture_output=True,
                text=True,
                timeout=60,
            )
            doc = json.loads(out.stdout.splitlines()[-1])
            return out.returncode, "" if doc["ok"] else doc["error"]

        assert write(damaged)[0] == 1 and "sha256 mismatch" in write(damaged)[1]
        assert not dest.parent.exists() or list(dest.parent.iterdir()) == []
        assert write(program) == (0, "")
        ino = dest.stat().st_ino
        assert dest.read_bytes() == program.data and stat.S_IMODE(dest.stat().st_mode) == 0o755
        assert write(program) == (0, "") and dest.stat().st_ino == ino  # unchanged: not rewritten
        dest.write_bytes(b"#!/bin/sh\nexit 0\n")  # an older (or altered) copy: damaged bytes do not replace it
        assert write(damaged)[0] == 1 and dest.read_bytes() == b"#!/bin/sh\nexit 0\n"
        assert write(program) == (0, "") and dest.read_bytes() == program.data and dest.stat().st_ino != ino
        assert [p.name for p in dest.parent.iterdir()] == ["verify-model"]
