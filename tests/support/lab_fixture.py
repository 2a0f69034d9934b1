"""The session-scoped ``lab`` fixture: a real lab brought up once per run.

Shared by tiers 2 (tests/lab) and 3 (tests/e2e) through tests/conftest.py,
so one pytest run brings the lab up once.

CLUSTERCTL_LAB_HOSTS (default 4) sets its size; CLUSTERCTL_LAB_KEEP=1 leaves
it running after the run, and a lab that was already up (same size) is used
as it is and left running.  Tests skip, with the reason, only when the lab
cannot exist here at all: not root, or systemd-nspawn missing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from clusterctl.lab import faults
from clusterctl.lab.config import LabConfig
from clusterctl.lab.session import LabSession, unavailable_reason


@pytest.fixture(scope="session")
def lab() -> Iterator[LabSession]:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    cfg = LabConfig.from_env()
    session = LabSession.start(
        cfg,
        hosts=int(os.environ.get("CLUSTERCTL_LAB_HOSTS", "4")),
        on_event=lambda s: print(f"lab: {s}", file=sys.stderr),
    )
    reused = session.up_result is not None and session.up_result.already_up
    if reused:
        faults.heal(cfg, None)  # tests start from a healthy lab
    yield session
    # A lab that was already up before the run (someone's working lab) stays up.
    if os.environ.get("CLUSTERCTL_LAB_KEEP") != "1" and not reused:
        session.stop()


@pytest.fixture
def healed_hosts(lab: LabSession, monkeypatch: pytest.MonkeyPatch, tmp_path) -> Iterator[list[str]]:
    """A list the test appends the names of hosts it injects faults into; their
    simulated hardware is healed afterwards.  The user's state dir (@failed,
    baselines) is a temporary one, so doctor runs leave nothing behind."""
    from clusterctl.lab.hardware import faults as hw_faults

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    touched: list[str] = []
    yield touched
    for name in touched:
        hw_faults.heal(lab.host_dir(name))
