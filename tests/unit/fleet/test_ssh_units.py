"""Pieces of the paramiko transport that need no network."""

from __future__ import annotations

import resource

import pytest

from clusterctl.fleet.fleet import max_fanout_for_fds, raise_nofile_limit
from clusterctl.fleet.ssh import JumpHost, ParamikoTransport
from clusterctl.inventory.model import SSHSettings


@pytest.mark.parametrize(
    "spec, want",
    [
        ("bastion", JumpHost(None, "bastion", 22)),
        ("ops@bastion:2222", JumpHost("ops", "bastion", 2222)),
        ("ops@[fd00::1]:22", JumpHost("ops", "fd00::1", 22)),
        ("10.0.0.1:2200", JumpHost(None, "10.0.0.1", 2200)),
    ],
)
def test_jump_host_parse(spec, want):
    assert JumpHost.parse(spec) == want


def test_jump_host_without_host_is_an_error():
    with pytest.raises(ValueError):
        JumpHost.parse("ops@")


def test_unusable_identity_file_is_reported_not_raised(tmp_path):
    bad = tmp_path / "id_bad"
    bad.write_text("not a key\n")
    keys, notes = ParamikoTransport(use_agent=False)._client_keys(SSHSettings(identity_file=str(bad)))
    assert keys == [] and str(bad) in notes[0]


def test_off_policy_warns_once(tmp_path):
    t = ParamikoTransport(host_key_policy="off")
    s = SSHSettings(known_hosts=str(tmp_path / "kh"))
    t._known_hosts(s)
    t._known_hosts(s)
    assert len(t.warnings) == 1 and "OFF" in t.warnings[0]


def test_nofile_limit_raised_to_hard_and_fanout_capped():
    soft = raise_nofile_limit()
    assert soft == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert hard == resource.RLIM_INFINITY or soft == hard
    assert max_fanout_for_fds(1024) == 240
    assert max_fanout_for_fds(10) == 1
