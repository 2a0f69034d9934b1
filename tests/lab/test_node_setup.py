"""``clusterctl node setup`` on the lab (issue 23): one host's GPUs lose persistence
mode, its (stand-in) nvidia-persistenced is disabled and its service user ``vllm``
has no memlock limit; doctor finds both on that host (``gpu.persistence`` and
``node.prereqs``), each naming ``node setup``; ``--plan`` shows that host's
changes; apply enables the daemon, writes the limits and sysctl drop-ins and the
MTU unit; doctor is then OK; a second apply changes nothing; ``--revert``
removes what it wrote and disables the daemon again.

The first two hosts of the session lab (any names, root or a sudo user).  Lab
hosts are containers: /proc/sys is read-only there, so the test's inventory
(a copy) keeps only a kernel parameter whose value is already right
(``arp_ignore = 0``, a fresh network namespace's default) and drops the others;
the unit tests change kernel parameters and MTUs on a directory tree instead.
"""

from __future__ import annotations

import json
import time

import yaml

from clusterctl.bringup import nodesetup
from clusterctl.cli.main import main
from clusterctl.lab.hardware import faults

#: A stand-in for the driver's daemon: started, it turns persistence mode on in the fake NVML state.
STANDIN = "/usr/local/sbin/lab-persistenced"
STANDIN_UNIT = "/etc/systemd/system/nvidia-persistenced.service"
INSTALL = f"""cat > {STANDIN} <<'EOF'
#!/usr/bin/python3
import json, os
p = "/var/lib/lab-hw/nvml.json"
d = json.load(open(p))
for g in d["gpus"]:
    g["persistence_mode"] = 1
t = p + ".tmp-persistenced"
json.dump(d, open(t, "w"))
os.replace(t, p)
EOF
chmod 0755 {STANDIN}
printf '[Unit]\\nDescription=lab stand-in for nvidia-persistenced\\n[Service]\\nType=oneshot\\nRemainAfterExit=yes\\nExecStart={STANDIN}\\n[Install]\\nWantedBy=multi-user.target\\n' > {STANDIN_UNIT}
systemctl daemon-reload"""


def _run(capsys, *args: str) -> tuple[int, str]:
    rc = main(list(args))
    return rc, capsys.readouterr().out


def test_node_setup_plans_applies_converges_and_reverts(lab, capsys, healed_hosts, tmp_path):
    t0 = time.monotonic()
    pair = lab.names[:2]
    hosts = ",".join(pair)
    victim = pair[1]
    doc = yaml.safe_load(lab.inventory.read_text())
    doc.setdefault("defaults", {})["vars"] = {
        "sysctl": {
            "kernel.numa_balancing": None,
            "net.ipv4.conf.all.arp_announce": None,
            "net.ipv4.conf.all.arp_ignore": 0,
        }
    }
    inv_path = tmp_path / "inventory.yaml"
    inv_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    inv = str(inv_path)
    had_user = {h: lab.run(h, "id -u vllm").returncode == 0 for h in pair}
    try:
        assert (
            lab.run(victim, INSTALL + "\nid -u vllm >/dev/null 2>&1 || useradd --system vllm", timeout=60).returncode
            == 0
        )
        healed_hosts.append(victim)
        faults.inject(lab.host_dir(victim), "persistence")

        rc, out = _run(
            capsys, "doctor", victim, "-i", inv, "--json", "--checks", "gpu.persistence,node.prereqs", "--interval", "0"
        )
        found = {(f["check"], f["subject"]): f for f in json.loads(out)["findings"] if f["severity"] != "OK"}
        assert rc == 1 and ("node.prereqs", "limits:vllm") in found, found
        assert any(c == "gpu.persistence" for c, _ in found), found
        assert all(f"clusterctl node setup --hosts '{victim}'" in f["action"] for f in found.values()), found

        rc, out = _run(capsys, "node", "setup", "--plan", "--detailed-exitcode", "-i", inv, "--hosts", hosts, "--json")
        plan = {p["host"]: p for p in json.loads(out)["plan"]}
        assert rc == 1 and all(p["error"] is None for p in plan.values()), out
        items = {h: {c["item"] for c in p["changes"]} for h, p in plan.items()}
        assert {c["item"]: (c["current"], c["wanted"]) for c in plan[victim]["changes"]}[nodesetup.PERSISTENCED] == (
            "disabled/inactive",
            "enabled/active",
        )
        assert nodesetup.PERSISTENCED not in items[pair[0]]  # no daemon there, GPUs in persistence mode: noted
        for h in pair:
            assert {nodesetup.SYSCTL_PATH, nodesetup.limits_path("vllm"), nodesetup.MTU_UNIT} <= items[h]
            assert not any(i.startswith("sysctl ") or i.endswith(" MTU") for i in items[h])  # already right

        rc, out = _run(capsys, "node", "setup", "-i", inv, "--hosts", hosts, "--serial", "100%", "--json")
        rep = json.loads(out)
        assert rc == 0 and rep["ok"], out
        assert {h["host"]: h["status"] for h in rep["hosts"]} == {pair[0]: "changed", victim: "changed"}

        rc, out = _run(
            capsys, "doctor", hosts, "-i", inv, "--json", "--checks", "gpu.persistence,node.prereqs", "--interval", "0"
        )
        assert rc == 0, [f for f in json.loads(out)["findings"] if f["severity"] != "OK"]

        rc, out = _run(capsys, "node", "setup", "-i", inv, "--hosts", hosts)
        assert rc == 0 and "node setup: done; unchanged 2" in out, out
        st = lab.run(
            victim,
            f"systemctl is-enabled {nodesetup.PERSISTENCED}; id -u vllm >/dev/null && echo user; "
            f"cat {nodesetup.SYSCTL_PATH} | grep -c arp_ignore; systemctl is-enabled {nodesetup.MTU_UNIT}",
        )
        assert st.stdout.split() == ["enabled", "user", "1", "enabled"], st

        rc, out = _run(capsys, "node", "setup", "--revert", "-i", inv, "--hosts", hosts, "--serial", "100%")
        assert rc == 0 and "node setup --revert: done; reverted 2" in out, out
        st = lab.run(
            victim,
            f"systemctl is-enabled {nodesetup.PERSISTENCED}; systemctl is-active "
            f"{nodesetup.PERSISTENCED}; ls {nodesetup.SYSCTL_PATH} {nodesetup.limits_path('vllm')} "
            f"{nodesetup.MTU_UNIT_PATH} {nodesetup.MTU_SCRIPT} {nodesetup.STATE_PATH} 2>/dev/null; "
            "id -u vllm >/dev/null 2>&1 && echo user",
        )
        assert st.stdout.split() == ["disabled", "inactive", "user"], st  # the test made the user, not node setup
    finally:
        lab.run(
            victim,
            f"systemctl disable --now {nodesetup.PERSISTENCED}; rm -f {STANDIN} {STANDIN_UNIT}; "
            "systemctl daemon-reload",
            timeout=60,
        )
        for h in pair:
            lab.run(
                h,
                f"systemctl disable {nodesetup.MTU_UNIT} 2>/dev/null; rm -f {nodesetup.SYSCTL_PATH} "
                f"{nodesetup.limits_path('vllm')} {nodesetup.MTU_UNIT_PATH} {nodesetup.MTU_SCRIPT} "
                f"{nodesetup.STATE_PATH}; systemctl daemon-reload"
                + ("" if had_user[h] else "; userdel vllm 2>/dev/null"),
                timeout=60,
            )
    print(f"node setup lab test: {time.monotonic() - t0:.1f} s")
