"""doctor --active: ib_write_bw parsing, pairing, thresholds, and the rows saying why not.

No RDMA hardware exists here: the parser runs on outputs written after
perftest's format (tests/fixtures/diagnose/roce/ib_write_bw.md) and the pair
logic on a fake runner that answers with those outputs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterctl.diagnose.active import RunOutput, active_findings, commands, endpoint, parse_ib_write_bw, plan_rounds
from clusterctl.diagnose.findings import Severity, exit_code

import roce_facts as R

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "diagnose" / "roce"
D5 = (FIX / "ib_write_bw_client_D5_mlx5_0.txt").read_text()
GBITS = (FIX / "ib_write_bw_client_gbits_n5000.txt").read_text()
NO_SERVER = (FIX / "ib_write_bw_client_no_server.txt").read_text()


def test_parse_mb_per_sec_duration_mode():
    r = parse_ib_write_bw(D5)
    assert (r.size, r.iterations, r.peak_gbps) == (65536, 3423900, 0.0)
    # perftest's MB is 2**20 bytes
    assert r.avg_gbps == pytest.approx(44578.12 * 2**20 * 8 / 1e9)
    assert round(r.avg_gbps, 1) == 373.9


def test_parse_gbits_and_garbage():
    r = parse_ib_write_bw(GBITS)
    assert (r.iterations, r.peak_gbps, r.avg_gbps) == (5000, 97.82, 97.61)
    assert parse_ib_write_bw(NO_SERVER) is None
    assert parse_ib_write_bw("") is None
    # a row without the header is not a result
    assert parse_ib_write_bw(" 65536 5000 1.0 2.0 0.1\n") is None


def test_rounds_pair_each_host_at_most_once_per_round():
    assert plan_rounds(["a", "b", "c", "d"]) == [[("a", "b"), ("c", "d")]]
    assert plan_rounds(["a", "b", "c"]) == [[("a", "b")], [("a", "c")]]
    assert plan_rounds(["a"]) == []
    for n in range(2, 12):
        hosts = [f"h{i}" for i in range(n)]
        rounds = plan_rounds(hosts)
        assert {h for r in rounds for p in r for h in p} == set(hosts)
        for r in rounds:
            flat = [h for p in r for h in p]
            assert len(flat) == len(set(flat))


# The link-local and the IPv4 RoCE v2 GID of one port, as sysfs writes them (what the collector
# records; tests/fixtures/probe/sysroot_roce) and as show_gids / hand-written data spell them.
SYSFS_GIDS = ("fe80:0000:0000:0000:ba3f:d2ff:fe10:0001", "0000:0000:0000:0000:0000:ffff:0a4d:010b")
SHORT_GIDS = ("fe80::ba3f:d2ff:fe10:1", "::ffff:10.77.1.11")


def perf_doc(
    host: str, speed_mbps: int = 400000, tool: str | None = "/usr/bin/ib_write_bw", gids: tuple[str, str] = SYSFS_GIDS
) -> dict:
    d = R.doc(host, [R.nic("eth2", "mlx5_0", speed_mbps=speed_mbps)])
    d["tools"] = {"ib_write_bw": tool}
    d["nics"][1]["rdma"]["gids"] = [
        {"index": 2, "gid": gids[0], "type": "RoCE v2"},
        {"index": 3, "gid": gids[1], "type": "RoCE v2"},
    ]
    return d


@pytest.mark.parametrize("gids", [SYSFS_GIDS, SHORT_GIDS], ids=["sysfs", "compressed"])
def test_endpoint_uses_the_data_nic_and_the_ipv4_roce_v2_gid(gids):
    ep = endpoint("gpu01", perf_doc("gpu01", gids=gids), R.inventory(2, 2))
    assert (ep.device, ep.port, ep.gid_index, ep.gbps) == ("mlx5_0", 1, 3, 400.0)
    assert "not installed" in endpoint("gpu01", perf_doc("gpu01", tool=None), None)


def test_commands_are_bounded_and_quoted():
    a = endpoint("gpu01", perf_doc("gpu01"), None)
    srv, cli = commands(a, a, "10.0.0.1; rm -rf /", 5, 18515, 20)
    assert srv.startswith("timeout -k 2 20 /usr/bin/ib_write_bw -d mlx5_0 -i 1 -F -D 5 -p 18515 -x 3")
    assert "'10.0.0.1; rm -rf /'" in cli and "for i in 1 2 3 4 5" in cli


class FakeRunner:
    """Answers each round: the client's output per client host."""

    def __init__(self, outputs: dict[str, RunOutput]):
        self.outputs, self.rounds = outputs, []

    def __call__(self, cmds, timeout):
        self.rounds.append((dict(cmds), timeout))
        return {h: self.outputs.get(h, RunOutput(0, "")) for h in cmds}


def run(docs, outputs, **kw):
    fake = FakeRunner(outputs)
    fs = active_findings(
        docs,
        {},
        inventory=R.inventory(len(docs), 2),
        runner=fake,
        addresses={h: f"10.0.0.{i}" for i, h in enumerate(docs)},
        thresholds=R.ctx({}).thresholds,
        **kw,
    )
    return fs, fake


def test_pairs_judged_against_the_link_speed_row():
    docs = {h: perf_doc(h) for h in ("gpu01", "gpu02", "gpu03", "gpu04")}
    slow = D5.replace("44578.12", "30000.00")  # 251.7 Gb/s: below 320, above 200
    fs, fake = run(docs, {"gpu02": RunOutput(0, D5), "gpu04": RunOutput(0, slow)})
    assert [(f.host, f.subject, f.severity) for f in fs] == [
        ("gpu02", "pair:gpu01", Severity.OK),
        ("gpu04", "pair:gpu03", Severity.WARN),
    ]
    assert fs[1].message == (
        "gpu04 mlx5_0 -> gpu03 mlx5_0: 251.7 Gb/s average over 5 s, below 320 Gb/s for a 400 Gb/s link"
    )
    ((cmds, timeout),) = fake.rounds
    assert set(cmds) == set(docs) and timeout == 30
    assert cmds["gpu02"].rstrip().endswith("exit $rc") and "10.0.0.0" in cmds["gpu02"]
    assert "10.0.0." not in cmds["gpu01"]


def test_slower_nic_of_the_pair_picks_the_row_and_crit():
    docs = {"gpu01": perf_doc("gpu01", 100000), "gpu02": perf_doc("gpu02")}
    fs, _ = run(docs, {"gpu02": RunOutput(0, GBITS)})
    assert [(f.severity, f.message.endswith("on a 100 Gb/s link")) for f in fs] == [(Severity.OK, True)]
    fs, _ = run(docs, {"gpu02": RunOutput(0, GBITS.replace("97.61", "40.00"))})
    assert fs[0].severity == Severity.CRIT and "below 50 Gb/s" in fs[0].message


def test_failed_or_hung_test_is_unknown_with_the_reason():
    docs = {h: perf_doc(h) for h in ("gpu01", "gpu02", "gpu03", "gpu04")}
    fs, _ = run(docs, {"gpu02": RunOutput(1, NO_SERVER), "gpu04": RunOutput(None, "", "timed out after 30 s")})
    assert [(f.host, f.severity) for f in fs] == [("gpu02", Severity.UNKNOWN), ("gpu04", Severity.UNKNOWN)]
    assert "exit status 1" in fs[0].message and "timed out after 30 s" in fs[1].message
    assert exit_code(fs) == 3


def test_odd_host_out_gets_a_second_round_and_max_pairs_splits_rounds():
    docs = {h: perf_doc(h) for h in ("gpu01", "gpu02", "gpu03")}
    fs, fake = run(docs, {"gpu02": RunOutput(0, D5), "gpu03": RunOutput(0, D5)})
    assert [set(c) for c, _ in fake.rounds] == [{"gpu01", "gpu02"}, {"gpu01", "gpu03"}]
    assert [f.severity for f in fs] == [Severity.OK, Severity.OK]
    docs = {h: perf_doc(h) for h in ("gpu01", "gpu02", "gpu03", "gpu04")}
    _, fake = run(docs, {}, max_pairs=1)
    assert [sorted(c) for c, _ in fake.rounds] == [["gpu01", "gpu02"], ["gpu03", "gpu04"]]


def test_hosts_without_perftest_are_unknown_and_not_paired():
    docs = {"gpu01": perf_doc("gpu01"), "gpu02": perf_doc("gpu02", tool=None), "gpu03": perf_doc("gpu03")}
    fs, fake = run(docs, {"gpu03": RunOutput(0, D5)})
    assert [(f.host, f.severity) for f in fs] == [("gpu02", Severity.UNKNOWN), ("gpu03", Severity.OK)]
    assert "ib_write_bw (perftest) is not installed" in fs[0].message
    assert [set(c) for c, _ in fake.rounds] == [{"gpu01", "gpu03"}]
    fs, fake = run({"gpu01": perf_doc("gpu01"), "gpu02": perf_doc("gpu02", tool=None)}, {})
    assert "no partner" in fs[-1].message and fake.rounds == []


def test_each_host_says_why_no_bandwidth_was_measured_without_a_runner():
    facts = {"a": {"tools": {"ib_write_bw": None}}, "b": perf_doc("b"), "c": {}}
    fs = active_findings(facts, {"d": "unreachable: timed out"})
    assert [(f.host, f.severity) for f in fs] == [(h, Severity.UNKNOWN) for h in "abcd"]
    assert "ib_write_bw (perftest) is not installed" in fs[0].message
    assert "found at /usr/bin/ib_write_bw" in fs[1].message
    assert "older collector" in fs[2].message and "no facts: unreachable" in fs[3].message
    assert exit_code(fs) == 3


def test_a_bundle_cannot_be_tested_actively():
    fs = active_findings({"a": perf_doc("a")}, {}, live=False)
    assert [f.message for f in fs] == ["no active test on a bundle"]
