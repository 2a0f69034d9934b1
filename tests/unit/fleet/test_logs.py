"""``clusterctl logs``: journal lines of several hosts merged by time, followed as a stream
(FakeTransport; the real journal over SSH is tests/lab/test_logs.py)."""

from __future__ import annotations

import json
import shlex

import pytest

from clusterctl.cli import logs as cli_logs
from clusterctl.cli.main import main
from clusterctl.errors import ConfigError
from clusterctl.fleet import Fleet, HostStatus
from clusterctl.fleet import logs as L
from clusterctl.fleet.transport import FakeReply, FakeTransport, HostFailure
from clusterctl.inventory.model import Host, SSHSettings

UNIT = "clusterctl-qwen-a.service"


def entry(t: float, msg: object, **fields: str) -> str:
    e = {"__REALTIME_TIMESTAMP": str(int(t * 1e6)), "MESSAGE": msg, "PRIORITY": "6", **fields}
    return json.dumps(e)


def test_the_command_quotes_everything_and_ors_the_matches():
    cmd = L.command(
        L.HostQuery({UNIT: "qwen-a", "clusterctl-x;rm -rf.service": "x"}, kernel=True),
        lines=50,
        since=L.parse_since("10m"),
        follow=False,
    )
    check, _, cmd = cmd.partition("; ")
    assert "_TRANSPORT=kernel" in check and L.NO_KERNEL_MARK in check
    argv = shlex.split(cmd)
    assert argv[:2] == ["journalctl", "--no-pager"] and ["-n", "50"] == argv[argv.index("-n") : argv.index("-n") + 2]
    assert argv[argv.index("--since") + 1] == "-600s"
    tail = argv[argv.index("--since") + 2 :]
    assert tail == [
        "_SYSTEMD_UNIT=clusterctl-qwen-a.service",
        "+",
        "UNIT=clusterctl-qwen-a.service",
        "+",
        "_SYSTEMD_UNIT=clusterctl-x;rm -rf.service",
        "+",
        "UNIT=clusterctl-x;rm -rf.service",
        "+",
        "_TRANSPORT=kernel",
    ]
    follow = L.command(L.HostQuery(kernel=True), lines=10, since=None, follow=True, duration=5)
    assert "; timeout 5 journalctl" in follow and " -f " in follow
    assert L.command(L.HostQuery({UNIT: "q"}), lines=None, since=None, follow=False).startswith("journalctl ")


@pytest.mark.parametrize(
    "text,want",
    [
        ("90s", "-90s"),
        ("10m", "-600s"),
        ("2h", "-7200s"),
        ("1d", "-86400s"),
        ("2026-12-01 14:30", "2026-12-01 14:30"),
        ("2026-12-01T14:30:05", "2026-12-01 14:30:05"),
    ],
)
def test_since_forms(text, want):
    assert L.parse_since(text) == want


@pytest.mark.parametrize("bad", ["yesterday; reboot", "10 parsecs", "-5m", ""])
def test_bad_since_and_grep_are_errors(bad):
    with pytest.raises(ConfigError, match="--since"):
        L.parse_since(bad)
    with pytest.raises(ConfigError, match="--grep"):
        L.compile_grep("(unclosed")


def test_entries_name_their_source_and_decode_byte_messages():
    q = L.HostQuery({UNIT: "qwen-a"}, kernel=True)
    unit_line = L.parse_entry(entry(1.5, "INFO started", _SYSTEMD_UNIT=UNIT), "h1", q)
    pid1_line = L.parse_entry(entry(2.0, "Main process exited", _SYSTEMD_UNIT="init.scope", UNIT=UNIT), "h1", q)
    kernel = L.parse_entry(entry(3.0, list(b"NVRM: Xid 79 \xff"), _TRANSPORT="kernel"), "h1", q)
    assert (unit_line.source, unit_line.time, unit_line.text) == ("qwen-a", 1.5, "INFO started")
    assert pid1_line.source == "qwen-a"
    assert kernel.source == "kernel" and kernel.text.startswith("NVRM: Xid 79")
    assert L.parse_entry("not json", "h1", q) is None and L.parse_entry("[1]", "h1", q) is None


def hosts(n: int) -> list[Host]:
    return [Host(f"h{i}", f"10.0.0.{i}", ssh=SSHSettings(user="root")) for i in range(1, n + 1)]


def journal_handler(per_host: dict[str, list[str]], failing: dict[str, HostFailure] | None = None):
    def handler(h, command, stdin):
        if failing and h.name in failing:
            return failing[h.name]
        return FakeReply(0, "".join(x + "\n" for x in per_host.get(h.name, [])))

    return handler


def test_read_merges_hosts_by_time_and_greps_before_the_tail():
    per_host = {
        "h1": [entry(1, "a1 ERROR"), entry(4, "a4"), entry(6, "a6 ERROR")],
        "h2": [entry(2, "b2"), entry(3, "b3 ERROR"), entry(5, "b5 ERROR")],
    }
    q = {h: L.HostQuery(kernel=True) for h in per_host}
    with Fleet(hosts(2), transport=FakeTransport(journal_handler(per_host))) as f:
        lines, res = L.read(f, q, lines=200, since=None)
        assert [x.text for x in lines] == ["a1 ERROR", "b2", "b3 ERROR", "a4", "b5 ERROR", "a6 ERROR"]
        assert [x.host for x in lines] == ["h1", "h2", "h2", "h1", "h2", "h1"]
        lines, _ = L.read(f, q, lines=2, since=None, grep=L.compile_grep("ERROR"))
        assert [x.text for x in lines] == ["b5 ERROR", "a6 ERROR"]
    per_host["h2"].insert(0, L.NO_KERNEL_MARK)
    notes: list[tuple[str, str]] = []
    with Fleet(hosts(2), transport=FakeTransport(journal_handler(per_host))) as f:
        lines, res = L.read(f, q, lines=200, since=None, on_notice=lambda h, t: notes.append((h, t)))
    assert notes == [("h2", L.NO_KERNEL_NOTE)] and len(lines) == 6


def test_splitter_joins_chunks_and_cuts_huge_lines(monkeypatch):
    s = L._Splitter()
    assert s.feed(b'{"a": ') == [] and s.feed(b'1}\n{"b"') == ['{"a": 1}'] and s.feed(b": 2}\n") == ['{"b": 2}']
    monkeypatch.setattr(L, "MAX_LINE", 8)
    s = L._Splitter()
    assert s.feed(b"0123456789abc") == ["01234567"] and s.feed(b"def\nok\n") == ["ok"]


def test_follow_streams_lines_in_arrival_order_and_a_dead_host_is_a_row():
    per_host = {"h1": [entry(1, "one"), entry(3, "three")], "h2": [entry(2, "two")]}
    failing = {"h3": HostFailure(HostStatus.UNREACHABLE, "connection refused")}
    got: list[tuple[str, str]] = []
    commands: list[str] = []

    def handler(h, command, stdin):
        commands.append(command)
        return journal_handler(per_host, failing)(h, command, stdin)

    q = {h: L.HostQuery({UNIT: "qwen-a"}) for h in ("h1", "h2", "h3")}
    with Fleet(hosts(3), transport=FakeTransport(handler)) as f:
        res = L.follow(f, q, lambda x: got.append((x.host, x.text)), lines=10, duration=1, grep=L.compile_grep("o"))
    assert sorted(got) == [("h1", "one"), ("h2", "two")]  # "three" does not match the grep
    assert all(" -f " in c and c.startswith("timeout 1 journalctl") for c in commands)
    rows = {r.host: r for r in res}
    assert L.follow_ended_normally(rows["h1"], 1) and not L.follow_ended_normally(rows["h3"], 1)
    assert rows["h1"].stdout == ""  # streamed, not kept


INVENTORY = """\
version: 1
defaults:
  gpus: {count: 2, model: H100-80GB, memory_gib: 80}
hosts:
  gpu[01-03]:
    address: 10.0.0.[1-3]
engines:
  vllm: {path: /opt/vllm/bin/vllm, version: 0.11.0}
models:
  qwen:
    path: /models/qwen
    arch: {layers: 64, hidden_size: 5120, attention_heads: 64, kv_heads: 8, head_dim: 128,
           vocab: 151936, params: 32762123264, dtype: bfloat16}
instances:
  qwen-a: {model: qwen, engine: vllm, placement: "gpu01:[0-1]", port: 8000}
  qwen-b: {model: qwen, engine: vllm, placement: "gpu02:[0-1]", port: 8000}
"""


@pytest.fixture
def cli(tmp_path, monkeypatch):
    inv = tmp_path / "inventory.yaml"
    inv.write_text(INVENTORY)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    seen: dict[str, str] = {}
    down: set[str] = set()
    lines = {
        "gpu01": [
            entry(10, "qwen-a up", _SYSTEMD_UNIT="clusterctl-qwen-a.service"),
            entry(12, "NVRM: Xid 79", _TRANSPORT="kernel"),
        ],
        "gpu02": [entry(11, "qwen-b up", _SYSTEMD_UNIT="clusterctl-qwen-b.service")],
        "gpu03": [entry(13, "gpu03 kernel", _TRANSPORT="kernel")],
    }

    def handler(h, command, stdin):
        seen[h.name] = command
        if h.name in down:
            return HostFailure(HostStatus.UNREACHABLE, "connection refused")
        return FakeReply(0, "".join(x + "\n" for x in lines[h.name]))

    real = cli_logs.inventory_fleet

    def fake_fleet(inv_, names, **kw):
        f = real(inv_, names, **kw)
        f.transport = FakeTransport(handler)
        return f

    monkeypatch.setattr(cli_logs, "inventory_fleet", fake_fleet)
    return inv, seen, down


def test_cli_instances_and_hosts_interleaved_with_their_source(cli, capsys):
    inv, seen, down = cli
    assert main(["logs", "qwen-*", "gpu03", "-i", str(inv)]) == 0
    out = capsys.readouterr().out.splitlines()
    sources = [o.split()[1] for o in out]
    # gpu01 was asked for qwen-a's unit only (no --kernel): its kernel line is not its concern
    assert "_TRANSPORT=kernel" not in seen["gpu01"] and "_TRANSPORT=kernel" in seen["gpu03"]
    assert (
        sources[0] == "gpu01/qwen-a" and sources[1] == "gpu02/qwen-b" and out[0].startswith("1970-01-01T00:00:10.000Z")
    )
    assert main(["logs", "qwen-a", "--kernel", "--json", "-i", str(inv)]) == 0
    docs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert "_TRANSPORT=kernel" in seen["gpu01"] and docs[0]["source"] == "qwen-a" and docs[0]["host"] == "gpu01"
    assert [d["source"] for d in docs] == ["qwen-a", "kernel"]
    down.add("gpu03")
    assert main(["logs", "qwen-a", "gpu03", "-i", str(inv)]) == 3
    cap = capsys.readouterr()
    assert "gpu03: unreachable: connection refused" in cap.err and "qwen-a up" in cap.out


def test_cli_usage_errors_exit_3(cli, capsys):
    inv, _, _ = cli
    assert main(["logs", "nosuch", "-i", str(inv)]) == 3
    assert "names no instance" in capsys.readouterr().err
    assert main(["logs", "qwen-a", "--since", "soon", "-i", str(inv)]) == 3
    assert main(["logs", "qwen-a", "--for", "5", "-i", str(inv)]) == 3
    assert "--for needs -f" in capsys.readouterr().err
