"""The probe on real lab hosts (systemd + OpenSSH in nspawn, fake NVML and
/sys/class), over the real Fleet and paramiko."""

from __future__ import annotations

import json

from clusterctl.cli.main import main
from clusterctl.fleet import Fleet
from clusterctl.inventory.loader import load_inventory
from clusterctl.lab.hardware import faults
from clusterctl.probe.run import collect_facts

UNIT = (
    "[Unit]\nDescription=probe test\n[Service]\nExecStart=/bin/sleep 3600\n"
    "Restart=always\n[Install]\nWantedBy=multi-user.target\n"
)


def probe(lab, names, **kw):
    inv = load_inventory(str(lab.inventory))
    hosts = [inv.hosts[n] for n in names]
    with Fleet(hosts, connect_timeout=10, command_timeout=60) as fleet:
        return collect_facts(fleet, timeout=60, **kw)


def test_every_lab_host_gives_facts(lab):
    res = probe(lab, lab.names)
    assert all(r.ok for r in res.values()), {h: r.reason for h, r in res.items() if not r.ok}
    for name, r in res.items():
        f = r.facts
        assert f.hostname == name
        assert f.gpus.available and len(f.gpus.devices) == 8, f.gpus.reason
        assert f.raw["gpus"]["pynvml"]["origin"] in ("node", "carried")
        assert len({g.uuid for g in f.gpus.devices}) == 8
        rdma = [n for n in f.nics if n.rdma is not None]
        assert rdma and all(n.rdma.state == "ACTIVE" for n in rdma)
        assert f.units is not None  # systemd answers on lab hosts
        # a fresh lab host has no kernel log yet (its journal has no kernel transport)
        assert [e for e in f.errors if e["source"] != "kernel_log"] == []
    uuids = [g.uuid for r in res.values() for g in r.facts.gpus.devices]
    assert len(set(uuids)) == len(uuids)  # every host has its own GPUs


def test_units_restarts_and_kernel_log_since_cursor(lab):
    name = lab.names[0]
    lab.run(name, "cat > /etc/systemd/system/clusterctl-probetest.service", input=UNIT, check=True)
    lab.run(name, "systemctl daemon-reload && systemctl start clusterctl-probetest", check=True)
    try:
        lab.run(name, "systemctl kill -s KILL clusterctl-probetest; sleep 0.5", check=True)
        faults.inject(lab.host_dir(name), "xid", code=13, gpu=0)
        first = probe(lab, [name])[name]
        assert first.ok, first.reason
        units = {u.unit: u for u in first.facts.units}
        u = units["clusterctl-probetest.service"]
        assert u.load_state == "loaded" and u.restarts >= 1 and u.since
        assert first.facts.kernel_log.source == "/var/log/kern.log"
        assert ": 13," in first.facts.kernel_log.lines[-1].text
        cursor = first.facts.kernel_log.cursor
        faults.inject(lab.host_dir(name), "xid", code=48, gpu=2)
        faults.inject(lab.host_dir(name), "gpu-lost", gpu=5)
        nxt = probe(lab, [name], kernel_log_cursor=cursor)[name].facts
        texts = [x.text for x in nxt.kernel_log.lines]
        assert ": 48," in texts[0] and any(": 79," in t for t in texts[1:])
        assert not any(": 13," in t for t in texts)  # only what came after the cursor
        assert [g.index for g in nxt.gpus.lost] == [5]
    finally:
        faults.heal(lab.host_dir(name))
        lab.run(
            name,
            "systemctl stop clusterctl-probetest; rm -f /etc/systemd/system/clusterctl-probetest.service;"
            " systemctl daemon-reload",
        )


def test_probe_leaves_nothing_behind_but_its_verified_copy(lab):
    """The probe writes nothing on a host except its own program, kept under its sha256 in the login
    user's ~/.cache/clusterctl/programs (0600 in a 0700 directory; clusterctl.fleet.cached), whose
    mtime each run refreshes (the newest copies are kept); a second probe adds no file."""
    name = lab.names[-1]
    find = (
        "find / -xdev -newer /tmp/probe-marker ! -path '/proc/*' ! -path '/var/log/journal/*' "
        "! -path '/run/*' ! -path /tmp/probe-marker 2>/dev/null | sort"
    )

    def written_by_a_probe() -> list[str]:
        lab.run(name, "touch /tmp/probe-marker", check=True)
        before = set(lab.run(name, find).stdout.splitlines())
        assert probe(lab, [name])[name].ok
        return sorted(set(lab.run(name, find).stdout.splitlines()) - before)

    first, second = written_by_a_probe(), written_by_a_probe()
    copies = [p for p in second if "/.cache/clusterctl/programs/" in p]
    assert len(copies) == 1 and second == copies  # the second run only refreshed its copy
    home = copies[0].split("/.cache/")[0]
    programs = f"{home}/.cache/clusterctl/programs"
    leading = {home, f"{home}/.cache", f"{home}/.cache/clusterctl", programs}
    assert [p for p in first if p not in leading and p != copies[0]] == []
    digest = copies[0].rsplit("/", 1)[1].removesuffix(".py")
    out = lab.run(name, f"stat -c %a {programs} {copies[0]} && sha256sum {copies[0]}", check=True).stdout.split()
    assert out[:3] == ["700", "600", digest]


def test_cli_json(lab, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    rc = main(["facts", "all", "-i", str(lab.inventory), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and sorted(out) == sorted(lab.names)
    assert all(doc["schema"] == 1 for doc in out.values())
