from __future__ import annotations

import json

import pytest

from clusterctl.errors import LabError
from clusterctl.lab import limits
from clusterctl.lab import state as st
from clusterctl.lab.config import LabConfig, plan_hosts


def test_inotify_limit_restored_only_when_the_last_lab_stops(tmp_path):
    knob, reg = tmp_path / "max_user_instances", tmp_path / "reg.json"
    knob.write_text("128\n")
    assert limits.hold("/a", reg, knob) == 128
    assert int(knob.read_text()) == limits.LAB_INOTIFY_INSTANCES
    assert limits.hold("/b", reg, knob) == 128  # the original, not the raised value
    assert limits.release("/a", reg, knob) is False
    assert int(knob.read_text()) == limits.LAB_INOTIFY_INSTANCES
    assert limits.release("/b", reg, knob) is True
    assert knob.read_text().strip() == "128"
    assert not reg.exists()
    assert limits.release("/b", reg, knob) is False  # nothing held: no-op


def test_a_higher_limit_is_left_alone(tmp_path):
    knob, reg = tmp_path / "k", tmp_path / "r.json"
    knob.write_text("100000\n")
    limits.hold("/a", reg, knob)
    assert knob.read_text().strip() == "100000"
    limits.release("/a", reg, knob)
    assert knob.read_text().strip() == "100000"


def test_state_round_trip_and_atomic_write(tmp_path):
    specs = plan_hosts(LabConfig(), 2)
    s = st.LabState(
        hosts=[st.HostState(specs[0], 11), st.HostState(specs[1], None)],
        gpus_per_host=4,
        gpu_model="X",
        ticker_pid=7,
        inotify_saved=128,
    )
    path = tmp_path / "state.json"
    st.save(path, s)
    assert json.loads(path.read_text())["version"] == st.STATE_VERSION
    assert not (tmp_path / "state.json.tmp").exists()
    assert st.load(path) == s
    assert st.load(tmp_path / "absent.json") is None


def test_corrupt_state_names_the_file(tmp_path):
    path = tmp_path / "state.json"
    path.write_text("{not json")
    with pytest.raises(LabError, match=r"state.json:1: unreadable lab state"):
        st.load(path)
