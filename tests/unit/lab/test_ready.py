from __future__ import annotations

from clusterctl.lab import manager, ready
from clusterctl.lab.config import LabConfig, plan_hosts


def test_ssh_command_pins_host_keys_and_never_prompts(tmp_path):
    cfg = LabConfig(lab_dir=tmp_path)
    h = plan_hosts(cfg, 2)[1]
    argv = ready.ssh_argv(cfg, h, "systemctl is-system-running", user="ops")
    assert argv[:3] == ["ssh", "-F", "/dev/null"]  # no user ssh_config
    opts = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    assert "StrictHostKeyChecking=yes" in opts
    assert f"UserKnownHostsFile={cfg.known_hosts}" in opts
    assert "BatchMode=yes" in opts and "IdentitiesOnly=yes" in opts
    assert argv[-3:] == ["ops@10.77.0.102", "--", "systemctl is-system-running"]
    interactive = ready.ssh_argv(cfg, h, None, tty=True)
    assert "-t" in interactive and "BatchMode=yes" not in interactive
    assert interactive[-1] == "root@10.77.0.102"


def test_etc_hosts_names_every_host():
    text = manager._etc_hosts(plan_hosts(LabConfig(), 3))
    assert "10.77.0.103\tlab03\n" in text and text.startswith("127.0.0.1\tlocalhost\n")


def test_every_fourth_host_has_the_inbox_nic_driver():
    assert [manager.nic_flavour(i) for i in range(1, 9)] == [
        "mlnx",
        "mlnx",
        "inbox",
        "mlnx",
        "mlnx",
        "mlnx",
        "inbox",
        "mlnx",
    ]
