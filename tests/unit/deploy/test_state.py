"""The deploy state directory: where it is, round trips, atomic writes, clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterctl.config import UserConfig
from clusterctl.deploy.state import (
    CORDONS,
    PLACEMENTS,
    REPLICAS,
    Cordon,
    Placement,
    StateError,
    StateStore,
    resolve_state_dir,
)


def test_precedence_flag_then_environment_then_user_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = UserConfig(state_dir=tmp_path / "cfg")
    monkeypatch.delenv("CLUSTERCTL_STATE_DIR", raising=False)
    assert resolve_state_dir(None, cfg) == tmp_path / "cfg" / "deploy"
    monkeypatch.setenv("CLUSTERCTL_STATE_DIR", str(tmp_path / "env"))
    assert resolve_state_dir(None, cfg) == tmp_path / "env"
    assert resolve_state_dir(str(tmp_path / "flag"), cfg) == tmp_path / "flag"


def test_a_missing_directory_is_empty_state(tmp_path: Path) -> None:
    st = StateStore(tmp_path / "nowhere").load()
    assert st.placements == {} and st.cordons == {} and st.replicas == {}


def test_update_round_trips_and_writes_only_what_changed(tmp_path: Path) -> None:
    store = StateStore(tmp_path / "d")
    with store.update() as st:
        st.placements["pool"] = {"pool-1": Placement("gpu01", (0, 1), 8000)}
        st.cordons["gpu02:3"] = Cordon("ECC errors", "ops@ctl", "2026-11-30T15:00:00Z")
    assert not store.path(REPLICAS).exists()
    with store.update() as st:
        st.replicas["pool"] = 4
    loaded = store.load()
    assert loaded.placements == {"pool": {"pool-1": Placement("gpu01", (0, 1), 8000)}}
    assert loaded.cordons["gpu02:3"].reason == "ECC errors"
    assert loaded.replicas == {"pool": 4}
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == [".lock", CORDONS, PLACEMENTS, REPLICAS]


def test_nothing_is_written_when_the_update_block_fails(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    with pytest.raises(RuntimeError):
        with store.update() as st:
            st.replicas["pool"] = 4
            raise RuntimeError("boom")
    assert store.load().replicas == {}


def test_save_placements_keeps_a_cordon_set_meanwhile(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    planned = store.load()
    with store.update() as st:
        st.cordons["gpu01"] = Cordon("maintenance", "ops@ctl", "2026-11-30T15:00:00Z")
    planned.placements["pool"] = {"pool-1": Placement("gpu02", (0,), 8000)}
    store.save_placements(planned.placements)
    loaded = store.load()
    assert set(loaded.cordons) == {"gpu01"} and "pool" in loaded.placements


@pytest.mark.parametrize(
    "name, text, where, message",
    [
        (PLACEMENTS, '{"version": 1,\n "templates": {', ":2:", "not valid JSON"),
        (PLACEMENTS, '[]', ":", "expected a JSON object"),
        (PLACEMENTS, '{"version": 7}', ":", "format version 7"),
        (
            PLACEMENTS,
            json.dumps({"version": 1, "templates": {"p": {"p-1": {"host": "a", "gpus": [], "port": 1}}}}),
            ":",
            "templates.p.p-1.gpus",
        ),
        (
            PLACEMENTS,
            json.dumps({"version": 1, "templates": {"p": {"p-1": {"host": "a", "gpus": [0], "port": 0}}}}),
            ":",
            "templates.p.p-1.port",
        ),
        (CORDONS, json.dumps({"version": 1, "cordons": {"a": "oops"}}), ":", "cordons.a"),
        (REPLICAS, json.dumps({"version": 1, "replicas": {"p": -1}}), ":", "replicas.p"),
    ],
)
def test_a_corrupt_file_is_an_error_naming_it(tmp_path: Path, name: str, text: str, where: str, message: str) -> None:
    (tmp_path / name).write_text(text)
    with pytest.raises(StateError) as e:
        StateStore(tmp_path).load()
    assert str(e.value).startswith(f"{tmp_path / name}{where}") and message in str(e.value)


def test_writes_leave_no_temporary_files(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    for n in range(3):
        with store.update() as st:
            st.replicas["p"] = n
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_a_busy_lock_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from clusterctl.deploy import state as state_mod
    from clusterctl.files import RunLock

    monkeypatch.setattr(state_mod, "LOCK_WAIT_S", 0.1)
    store = StateStore(tmp_path)
    with RunLock(tmp_path / ".lock"):
        with pytest.raises(StateError, match="held the deploy state lock"):
            with store.update() as st:
                st.replicas["p"] = 1
    assert store.load().replicas == {}


def test_an_unwritable_directory_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(StateError, match="cannot lock the deploy state directory"):
        StateStore(blocker / "deploy").save_placements({})
