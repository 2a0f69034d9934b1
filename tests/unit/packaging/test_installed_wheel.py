"""clusterctl installed from a built wheel into a fresh venv, not run from the source tree.

The wheel is built offline from a copy of the tracked sources (``pip wheel --no-deps
--no-build-isolation --no-index``), installed with ``--no-index --no-deps`` into a venv
that sees this interpreter's packages (``--system-site-packages``: typer, paramiko...)
and run with no ``PYTHONPATH``, from a directory outside the tree.  What it must carry:
the templates, the probe payload, and the check data (``checks/`` ships as
``clusterctl/_checks``; without it doctor would judge XIDs with no catalogue).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
FIX = ROOT / "tests" / "fixtures" / "diagnose"
#: What the build needs from the tree (the rest of the repository is not packaged).
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "clusterctl", "checks")

#: Run inside the venv: every command and subcommand's --help through the real entry
#: point function; prints one JSON line (failures, count, where clusterctl came from).
HELP_WALK = r"""
import contextlib, io, json, sys
import typer
import clusterctl
from clusterctl.cli import main as m

def walk(cmd, path):
    yield path
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from walk(sub, path + [name])

root = typer.main.get_command(m.build_app())
bad, n = [], 0
for path in walk(root, []):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        rc = m.main(path + ["--help"])
    n += 1
    if rc != 0 or "Usage" not in out.getvalue():
        bad.append([" ".join(path), rc])
print(json.dumps({"file": clusterctl.__file__, "count": n, "bad": bad}))
"""


def _run(argv: list[str], *, env: dict[str, str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """(venv bin dir, clean environment, work dir, wheel) for clusterctl installed from a wheel."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        p = ROOT / name
        if p.is_dir():
            shutil.copytree(p, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.egg-info"))
        else:
            shutil.copy2(p, src / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CLUSTERCTL_", "PIP_"))}
    env.update(
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_INPUT="1",
        HOME=str(tmp / "home"),
        XDG_CONFIG_HOME=str(tmp / "home" / ".config"),
        XDG_STATE_HOME=str(tmp / "home" / ".state"),
    )
    dist = tmp / "dist"
    p = _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(dist),
            str(src),
        ],
        env=env,
        cwd=tmp,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    wheel = next(dist.glob("clusterctl-*.whl"))
    venv = tmp / "venv"
    p = _run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], env=env, cwd=tmp)
    assert p.returncode == 0, p.stdout + p.stderr
    p = _run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheel)],
        env=env,
        cwd=tmp,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    work = tmp / "work"
    work.mkdir()
    return {"bin": venv / "bin", "env": env, "work": work, "wheel": wheel, "venv": venv}


def test_the_wheel_carries_templates_probe_payload_and_check_data(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    for shipped in sorted((ROOT / "checks").rglob("*")):
        if shipped.is_file():
            assert f"clusterctl/_checks/{shipped.relative_to(ROOT / 'checks')}" in names, shipped
    for needed in (
        "clusterctl/templates/vllm-instance.service.j2",
        "clusterctl/templates/report.html.j2",
        "clusterctl/node/collector.py",
        "clusterctl/probe/payload.py",
        "clusterctl/node/deploy.py",
        "clusterctl/lab/hardware/nvml/fake_nvml.c",
    ):
        assert needed in names, needed


def test_every_command_help_runs_from_the_installed_package(installed):
    p = _run([str(installed["bin"] / "python"), "-c", HELP_WALK], env=installed["env"], cwd=installed["work"])
    assert p.returncode == 0, p.stdout + p.stderr
    result = json.loads(p.stdout.strip().splitlines()[-1])
    assert str(installed["venv"]) in result["file"] and str(ROOT) not in result["file"]
    assert result["bad"] == [] and result["count"] > 40, result
    # and the console script itself
    p = _run([str(installed["bin"] / "clusterctl"), "--help"], env=installed["env"], cwd=installed["work"])
    assert p.returncode == 0 and "doctor" in p.stdout, p.stdout + p.stderr


def _hand_bundle(where: Path) -> Path:
    """A bundle as a colleague sends it: recorded kernel log (XID 79) and vLLM journal."""
    d = where / "bundle" / "hosts" / "gpu07"
    (d / "units").mkdir(parents=True)
    shutil.copy(FIX / "gpu" / "journal_short_iso_xid.log", d / "kernel.log")
    shutil.copy(FIX / "vllm" / "startup_fail_kv_cache_exhaustion_v0.11.0.log", d / "units" / "qwen-a.log")
    return where / "bundle"


def test_installed_doctor_judges_a_recorded_bundle_with_the_shipped_catalogue(installed, tmp_path):
    bundle = _hand_bundle(tmp_path)
    p = _run(
        [str(installed["bin"] / "clusterctl"), "doctor", "--from", str(bundle), "--json"],
        env=installed["env"],
        cwd=installed["work"],
    )
    assert p.returncode == 2, p.stdout + p.stderr
    findings = json.loads(p.stdout)["findings"]
    xid79 = [f for f in findings if f["check"] == "gpu.xid" and "79" in f["message"]]
    # CRIT with the catalogue's bucket action: an absent catalogue would give WARN "unknown code"
    assert xid79 and xid79[0]["severity"] == "CRIT" and "power-cycle" in xid79[0]["action"], xid79


def test_a_site_directory_overrides_one_file_and_an_empty_catalogue_is_an_error(installed, tmp_path):
    bundle = _hand_bundle(tmp_path)
    site = tmp_path / "site"
    site.mkdir()
    (site / "xid.yaml").write_text(
        "buckets: {DESK: call the site's GPU desk}\ncodes:\n  79: {name: FELL_OFF, severity: WARN, bucket: DESK}\n"
    )
    env = dict(installed["env"], CLUSTERCTL_CHECKS_DIR=str(site))
    p = _run(
        [str(installed["bin"] / "clusterctl"), "doctor", "--from", str(bundle), "--json", "--checks", "xid,oom"],
        env=env,
        cwd=installed["work"],
    )
    findings = json.loads(p.stdout)["findings"]
    xid79 = [f for f in findings if f["check"] == "gpu.xid" and "79" in f["message"]]
    assert xid79 and xid79[0]["severity"] == "WARN" and "site's GPU desk" in xid79[0]["action"], xid79
    assert any(f["check"] == "oom.cause" and f["severity"] == "CRIT" for f in findings)  # gpu.yaml still shipped
    (site / "xid.yaml").write_text("codes: {}  # emptied by mistake\n")
    p = _run([str(installed["bin"] / "clusterctl"), "doctor", "--from", str(bundle)], env=env, cwd=installed["work"])
    assert p.returncode == 3 and f"{site / 'xid.yaml'}:1" in p.stderr and "empty" in p.stderr, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
