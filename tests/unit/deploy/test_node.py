"""The node program's file work (apply, rollback, read) in a temporary root, systemctl recorded.

systemd is replaced by a recorder of ``systemctl`` calls; the lab test runs
the same program under real systemd.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Iterator

import pytest

from clusterctl.node import deploy as node


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(node, "UNIT_DIR", str(tmp_path / "units"))
    monkeypatch.setattr(node, "ENV_DIR", str(tmp_path / "env"))
    monkeypatch.setattr(node, "STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(node, "PREVIOUS_DIR", str(tmp_path / "state" / "previous"))
    monkeypatch.setattr(node, "LOCK_PATH", str(tmp_path / "deploy.lock"))

    failing: dict[str, tuple[str, str]] = {}  # unit -> (verb it fails, systemctl's message or "")

    def systemctl(*args: str, timeout: int = 120) -> tuple[int, str, str]:
        calls.append(args)
        if args[0] == "show":
            units = args[3:]
            return (
                0,
                "\n\n".join(
                    f"Id={u}\nActiveState={'failed' if u in failing else 'active'}\nSubState=running\nNRestarts=0"
                    for u in units
                ),
                "",
            )
        bad = [u for u in args[1:] if failing.get(u, ("", ""))[0] == args[0]]
        if bad:
            return 1, "", "\n".join(failing[u][1] for u in bad if failing[u][1])
        return 0, "", ""

    monkeypatch.setattr(node, "_systemctl", systemctl)
    models = tmp_path / "models"
    for v in ("v1", "v2"):
        (models / ".versions" / "m" / v).mkdir(parents=True)
        (models / ".versions" / "m" / v / ".clusterctl-verified").write_text(json.dumps({"version": v}))
    os.symlink(".versions/m/v1", models / "m")
    yield {"tmp": tmp_path, "calls": calls, "model": str(models / "m"), "failing": failing}


def item(name: str, flags: str, key: str, model: str) -> dict[str, Any]:
    return {
        "instance": name,
        "unit_text": f"[Service]\nExecStart=/opt/vllm serve {flags}\n",
        "env_text": f"VLLM_API_KEY={key}\n",
        "model_path": model,
        "enable": True,
    }


def unit(root: dict[str, Any], name: str) -> str:
    return (root["tmp"] / "units" / f"clusterctl-{name}.service").read_text()


def test_apply_writes_files_saves_previous_and_restarts_only_what_it_is_told(root: dict[str, Any]) -> None:
    res = node.op_apply(
        {
            "op": "apply",
            "run_id": "r1",
            "write": [item("a", "--x 1", "k1", root["model"])],
            "start": ["a"],
            "restart": [],
            "remove": [],
        }
    )
    assert res["ok"]
    env = root["tmp"] / "env" / "a.env"
    assert stat.S_IMODE(env.stat().st_mode) == 0o600 and env.read_text() == "VLLM_API_KEY=k1\n"
    assert (root["tmp"] / "state" / "previous" / "a.absent").exists()
    assert ("daemon-reload",) in root["calls"] and ("start", "clusterctl-a.service") in root["calls"]
    assert not any(c[0] == "restart" for c in root["calls"])
    assert not list((root["tmp"] / "units").glob(".*tmp*"))  # no temporary file left


def test_apply_stops_what_it_lists_before_writing_and_starting(root: dict[str, Any]) -> None:
    res = node.op_apply(
        {
            "op": "apply",
            "run_id": "r1",
            "write": [item("a", "--x 1", "k1", root["model"])],
            "stop": ["a", "b"],
            "start": [],
            "restart": [],
            "remove": [],
        }
    )
    assert res["ok"]
    assert root["calls"][:1] == [("stop", "clusterctl-a.service", "clusterctl-b.service")]
    assert not any(c[0] in ("start", "restart") for c in root["calls"])


def test_read_reports_digest_and_salted_hashes_never_env_values(root: dict[str, Any]) -> None:
    node.op_apply({"op": "apply", "write": [item("a", "--x 1", "secret-k", root["model"])], "start": ["a"]})
    out = node.op_read({"op": "read", "salt": "s", "model_paths": [root["model"]]})
    inst = out["instances"]["a"]
    assert inst["digest"] == node.digest_of(unit(root, "a"), "VLLM_API_KEY=secret-k\n")
    assert "secret-k" not in json.dumps(out) and set(inst["env_hashes"]) == {"VLLM_API_KEY"}
    assert out["models"][root["model"]]["verified"] and out["models"][root["model"]]["version"] == "v1"


def test_rollback_restores_unit_env_and_model_link_and_a_second_rollback_goes_forward(root: dict[str, Any]) -> None:
    node.op_apply({"op": "apply", "run_id": "r1", "write": [item("a", "--x 1", "k1", root["model"])], "start": ["a"]})
    os.symlink(".versions/m/v2", root["model"] + ".new")
    os.rename(root["model"] + ".new", root["model"])  # what staging v2 does
    node.op_apply(
        {
            "op": "apply",
            "run_id": "r2",
            "write": [{**item("a", "--x 2", "k2", root["model"]), "model_before": ".versions/m/v1"}],
            "restart": ["a"],
        }
    )
    assert "--x 2" in unit(root, "a")
    res = node.op_rollback({"op": "rollback", "instances": ["a"], "run_id": "r2", "own_run_id": "rb"})
    assert res["ok"] and res["restored"] == ["a"]
    assert "--x 1" in unit(root, "a") and (root["tmp"] / "env" / "a.env").read_text() == "VLLM_API_KEY=k1\n"
    assert os.readlink(root["model"]) == ".versions/m/v1"
    assert ("restart", "clusterctl-a.service") in root["calls"]
    node.op_rollback({"op": "rollback", "instances": ["a"], "own_run_id": "rb2"})
    assert "--x 2" in unit(root, "a") and os.readlink(root["model"]) == ".versions/m/v2"


def test_rollback_of_a_new_instance_removes_it(root: dict[str, Any]) -> None:
    node.op_apply({"op": "apply", "run_id": "r1", "write": [item("b", "--y", "k", root["model"])], "start": ["b"]})
    res = node.op_rollback({"op": "rollback", "instances": ["b"], "run_id": "r1", "own_run_id": "rb"})
    assert res["removed"] == ["b"] and not (root["tmp"] / "units" / "clusterctl-b.service").exists()
    assert not (root["tmp"] / "env" / "b.env").exists() and ("stop", "clusterctl-b.service") in root["calls"]


def test_rollback_for_a_run_never_restores_an_older_runs_copies(root: dict[str, Any]) -> None:
    node.op_apply({"op": "apply", "run_id": "r1", "write": [item("a", "--x 1", "k1", root["model"])], "start": ["a"]})
    res = node.op_rollback({"op": "rollback", "instances": ["a"], "run_id": "r-other", "own_run_id": "rb"})
    assert (
        res["missing"] == ["a"] and res["restored"] == [] and (root["tmp"] / "units" / "clusterctl-a.service").exists()
    )


def test_remove_saves_a_copy_then_stops_disables_and_deletes(root: dict[str, Any]) -> None:
    node.op_apply({"op": "apply", "run_id": "r1", "write": [item("a", "--x 1", "k1", root["model"])], "start": ["a"]})
    node.op_apply({"op": "apply", "run_id": "r2", "remove": ["a"]})
    assert not (root["tmp"] / "units" / "clusterctl-a.service").exists()
    assert "--x 1" in (root["tmp"] / "state" / "previous" / "a.service").read_text()
    assert [c for c in root["calls"] if c[-1] == "clusterctl-a.service" and c[0] in ("stop", "disable")] == [
        ("stop", "clusterctl-a.service"),
        ("disable", "clusterctl-a.service"),
    ]


@pytest.mark.parametrize(
    "out,want",
    [
        ("systemd 252 (252.30-1~deb12u2)\n+PAM +AUDIT +SELINUX\n", 252),  # Debian 12
        ("systemd 255 (255.4-1ubuntu8.4)\n+PAM +AUDIT\n", 255),  # Ubuntu 24.04
        ("systemd 239 (239-78.el8)\n+PAM +AUDIT\n", 239),  # RHEL 8
        ("", None),
    ],
)
def test_read_reports_the_hosts_systemd_version(
    root: dict[str, Any], monkeypatch: pytest.MonkeyPatch, out: str, want: int | None
) -> None:
    monkeypatch.setattr(
        node, "_systemctl", lambda *a, timeout=120: (0, out, "") if a[0] == "--version" else (0, "", "")
    )
    assert node.op_read({"op": "read", "salt": "s"})["systemd_version"] == want


def test_read_lists_gpu_uuids_only_when_asked(root: dict[str, Any]) -> None:
    lister = "import sys\nassert sys.argv[1:] == ['--list']\nprint('0 GPU-aaaa-1111')\nprint('1 GPU-bbbb-2222')\n"
    assert node.op_read({"op": "read", "salt": "s", "gpu_lister": lister})["gpu_uuids"] == {
        "0": "GPU-aaaa-1111",
        "1": "GPU-bbbb-2222",
    }
    assert node.op_read({"op": "read", "salt": "s"})["gpu_uuids"] is None
    assert node.op_read({"op": "read", "salt": "s", "gpu_lister": "raise SystemExit(1)"})["gpu_uuids"] is None


def three(root: dict[str, Any]) -> dict[str, Any]:
    """A host with three replicas: a and b changed (restart), c new (start)."""
    return {
        "op": "apply",
        "run_id": "r1",
        "write": [item(n, f"--{n}", "k", root["model"]) for n in ("a", "b", "c")],
        "restart": ["a", "b"],
        "start": ["c"],
        "remove": [],
    }


def test_apply_of_a_host_with_three_replicas_is_one_systemctl_call_per_verb(root: dict[str, Any]) -> None:
    res = node.op_apply(three(root))
    assert res["ok"], res
    units = tuple(f"clusterctl-{n}.service" for n in ("a", "b", "c"))
    assert root["calls"] == [
        ("daemon-reload",),
        ("enable", *units),
        ("restart", *units[:2]),
        ("start", units[2]),
    ]


def test_one_failed_restart_among_three_is_named_from_systemctls_message(root: dict[str, Any]) -> None:
    root["failing"]["clusterctl-b.service"] = (
        "restart",
        "Job for clusterctl-b.service failed because the control process exited with error code.",
    )
    res = node.op_apply(three(root))
    assert not res["ok"] and res["kind"] == "systemctl"
    assert list(res["errors"]) == ["clusterctl-b.service"] and "control process exited" in res["error"]
    assert ("start", "clusterctl-c.service") in root["calls"]  # the others still started


def test_a_failed_restart_systemctl_does_not_name_is_found_by_the_units_state(root: dict[str, Any]) -> None:
    root["failing"]["clusterctl-a.service"] = ("restart", "")
    res = node.op_apply(three(root))
    assert list(res["errors"]) == ["clusterctl-a.service"] and "failed after the call" in res["error"]
    assert [c for c in root["calls"] if c[0] == "restart"] == [
        ("restart", "clusterctl-a.service", "clusterctl-b.service")
    ]  # never restarted twice


def test_a_failed_enable_is_redone_unit_by_unit_to_name_the_unit(root: dict[str, Any]) -> None:
    root["failing"]["clusterctl-c.service"] = ("enable", "Failed to enable unit: Unit file does not exist.")
    res = node.op_apply(three(root))
    assert list(res["errors"]) == ["clusterctl-c.service"]
    assert ("enable", "clusterctl-a.service") in root["calls"] and ("enable", "clusterctl-b.service") in root["calls"]


def test_removing_two_units_stops_and_disables_them_in_one_call_each(root: dict[str, Any]) -> None:
    node.op_apply(three(root))
    root["calls"].clear()
    res = node.op_apply({"op": "apply", "run_id": "r2", "remove": ["a", "b"]})
    assert res["ok"] and not (root["tmp"] / "units" / "clusterctl-a.service").exists()
    ab = ("clusterctl-a.service", "clusterctl-b.service")
    assert root["calls"] == [("stop", *ab), ("disable", *ab), ("daemon-reload",), ("reset-failed", *ab)]


def test_apply_switches_the_model_link_to_a_verified_version(root: dict[str, Any]) -> None:
    job = {**three(root), "relink": [{"path": root["model"], "target": ".versions/m/v2", "version": "v2"}]}
    assert node.op_apply(job)["ok"]
    assert os.readlink(root["model"]) == ".versions/m/v2"


@pytest.mark.parametrize(
    "target,version,why",
    [
        (".versions/m/v9", "v9", "target .versions/m/v9 is missing"),
        (".versions/m/v2", "v3", "not the verified version v3"),  # the directory holds v2's marker
    ],
)
def test_a_switch_to_a_missing_or_unverified_version_fails_before_anything_changes(
    root: dict[str, Any], target: str, version: str, why: str
) -> None:
    job = {**three(root), "relink": [{"path": root["model"], "target": target, "version": version}]}
    res = node.op_apply(job)
    assert not res["ok"] and res["kind"] == "relink" and why in res["error"], res
    assert os.readlink(root["model"]) == ".versions/m/v1"
    assert root["calls"] == [] and not (root["tmp"] / "units").exists()


def test_putting_back_a_link_whose_target_is_gone_is_reported_not_skipped(root: dict[str, Any]) -> None:
    res = node.op_apply(
        {"op": "apply", "run_id": "r1", "relink": [{"path": root["model"], "target": ".versions/m/v0"}]}
    )
    assert not res["ok"] and "target .versions/m/v0 is missing" in res["error"]
    assert os.readlink(root["model"]) == ".versions/m/v1"
