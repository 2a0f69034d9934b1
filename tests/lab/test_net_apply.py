"""``clusterctl net apply`` on the lab (issue 23): a host with PFC on priority 4
and trust pcp is found by doctor, which names the command; ``--plan`` shows the
two changes on that host only; apply fixes it through the fake mlnx_qos/dcb
and the installed ``roce-qos.service``; doctor is then OK; a second apply
changes nothing.

Uses the first two hosts of the session lab (any names, either NIC flavour,
root or a sudo user) and removes the persistence unit afterwards, so the
shared lab is left as it was found.
"""

from __future__ import annotations

import json

from clusterctl.bringup import netqos
from clusterctl.cli.main import main
from clusterctl.lab.hardware import faults


def _run(capsys, *args: str) -> tuple[int, str]:
    rc = main(list(args))
    return rc, capsys.readouterr().out


def test_net_apply_fixes_pfc_and_trust_on_one_host_and_then_has_nothing_to_do(lab, capsys, healed_hosts):
    inv = str(lab.inventory)
    pair = lab.names[:2]
    hosts = ",".join(pair)
    victim = pair[1]
    try:
        # A lab host starts without the persistence unit: the first apply installs it on both.
        rc, out = _run(capsys, "net", "apply", "-i", inv, "--hosts", hosts, "--serial", "100%", "--json")
        first = json.loads(out)
        assert rc == 0 and first["ok"], out
        assert {h["host"] for h in first["hosts"] if h["status"] == "changed"} <= set(pair)

        healed_hosts.append(victim)
        faults.inject(lab.host_dir(victim), "qos-pfc", nic="eth2", priority=4)
        faults.inject(lab.host_dir(victim), "qos-trust", nic="eth2", trust="pcp")

        rc, out = _run(capsys, "doctor", hosts, "-i", inv, "--json", "--checks", "roce.qos", "--interval", "0")
        found = [f for f in json.loads(out)["findings"] if f["severity"] != "OK"]
        assert rc == 2 and {f["host"] for f in found} == {victim}, found
        assert all(f"clusterctl net apply --hosts '{victim}'" in f["action"] for f in found), found

        rc, out = _run(capsys, "net", "apply", "--plan", "--detailed-exitcode", "-i", inv, "--hosts", hosts, "--json")
        plan = {p["host"]: p for p in json.loads(out)["plan"]}
        assert rc == 1 and plan[pair[0]]["changes"] == [], out
        assert [(c["nic"], c["item"], c["current"], c["wanted"]) for c in plan[victim]["changes"]] == [
            ("eth2", "trust", "pcp", "dscp"),
            ("eth2", "PFC priorities", "4", "3"),
        ]

        rc, out = _run(capsys, "net", "apply", "-i", inv, "--hosts", hosts, "--json")
        rep = json.loads(out)
        assert rc == 0 and rep["ok"], out
        assert {h["host"]: h["status"] for h in rep["hosts"]} == {pair[0]: "unchanged", victim: "changed"}

        rc, out = _run(capsys, "doctor", hosts, "-i", inv, "--json", "--checks", "roce.qos", "--interval", "0")
        assert rc == 0, [f for f in json.loads(out)["findings"] if f["severity"] != "OK"]

        rc, out = _run(capsys, "net", "apply", "-i", inv, "--hosts", hosts)
        assert rc == 0 and out.count(": unchanged") == 2 and "changed 0" not in out, out
        assert "net apply: done; unchanged 2" in out
        enabled = lab.run(victim, f"systemctl is-enabled {netqos.UNIT}; systemctl is-active {netqos.UNIT}")
        assert enabled.stdout.split() == ["enabled", "active"], enabled
    finally:
        for h in pair:
            lab.run(
                h,
                f"systemctl disable --now {netqos.UNIT}; rm -f {netqos.UNIT_PATH} {netqos.SCRIPT_PATH}; "
                "systemctl daemon-reload",
                timeout=60,
            )
