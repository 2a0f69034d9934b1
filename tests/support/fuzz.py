"""Bounded fuzzing of clusterctl's inputs: every case runs the real CLI under caps.

Each *kind* of input (inventories, ssh_config, Ansible INI/YAML, the history
database, bundles, SSE streams) has a generator that writes hostile cases into a
directory: a case is a ``clusterctl`` argv plus environment.  :func:`run_cases`
runs a batch of cases in ONE child process (python start-up is paid once) under

* ``RLIMIT_AS`` (``mem_mib``): an input that would exhaust memory hits a
  ``MemoryError`` in the child instead of the machine;
* ``RLIMIT_CPU`` and a wall-clock alarm per case (``case_s``): a hang is
  interrupted and counted, the batch goes on; the parent kills the child if
  even that fails (``batch timeout``);
* ``RLIMIT_FSIZE`` (64 MiB): a case cannot fill the disk.

A case is a failure when it tracebacks (the CLI's safety net line
"unexpected internal error", a ``Traceback``, or an exit code outside 0-3),
hangs past ``case_s``, or runs out of memory.  :class:`Tally` counts inputs,
tracebacks, hangs, memory failures and the child's peak RSS.

Used by the unit tests (a few cases per kind, a few seconds) and by
``benchmarks/fuzz/campaign.py`` (thousands, figures in docs/hardening.md).
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import sqlite3
import subprocess
import sys
import tarfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).resolve()


@dataclass
class Case:
    """One input: ``clusterctl ARGV`` with ``env`` added to the environment."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    note: str = ""


@dataclass
class Tally:
    kind: str
    inputs: int = 0
    ok: int = 0
    tracebacks: int = 0
    hangs: int = 0
    memory: int = 0
    peak_rss_mib: float = 0.0
    seconds: float = 0.0
    failures: list[dict[str, Any]] = field(default_factory=list)
    #: every case's result (status, rc, seconds, the end of its stderr), in order
    results: list[dict[str, Any]] = field(default_factory=list, repr=False)

    @property
    def failed(self) -> int:
        return self.tracebacks + self.hangs + self.memory

    def add(self, other: "Tally") -> None:
        for k in ("inputs", "ok", "tracebacks", "hangs", "memory", "seconds"):
            setattr(self, k, getattr(self, k) + getattr(other, k))
        self.peak_rss_mib = max(self.peak_rss_mib, other.peak_rss_mib)
        self.failures += other.failures

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["failures"] = self.failures[:20]
        del d["results"]
        return d


# ------------------------------------------------------------------ the child


class _Hang(BaseException):
    """Raised by the per-case alarm; a BaseException so no ``except Exception`` swallows it."""


def _alarm(signum: int, frame: Any) -> None:
    raise _Hang()


def _child(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    mem = spec["mem_mib"] << 20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))
    cpu = int(spec["case_s"] * len(spec["cases"]) + 30)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from clusterctl.cli.main import build_app, main

    build_app()  # import every command module before the clocks start: a slow import is not a hang
    signal.signal(signal.SIGALRM, _alarm)
    results = []
    base_env = dict(os.environ)
    for case in spec["cases"]:
        os.environ.clear()
        os.environ.update(base_env, **case["env"])
        out, err = io.StringIO(), io.StringIO()
        t0 = time.monotonic()
        status, rc = "ok", None
        signal.setitimer(signal.ITIMER_REAL, spec["case_s"])
        try:
            with redirect_stdout(out), redirect_stderr(err):
                rc = main(list(case["argv"]))
        except _Hang:
            status = "hang"
        except MemoryError:
            status = "memory"
        except BaseException as e:  # noqa: BLE001 - the point is to see everything
            status = "traceback"
            err.write(f"{type(e).__name__}: {e}")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        text = err.getvalue()
        if status == "ok":
            if "MemoryError" in text:
                status = "memory"
            elif "unexpected internal error" in text or "Traceback" in text or rc not in (0, 1, 2, 3):
                status = "traceback"
        results.append(
            {
                "status": status,
                "rc": rc,
                "s": round(time.monotonic() - t0, 3),
                "err": text[-600:],
                "out": out.getvalue()[-600:],
                "argv": case["argv"][:6],
                "note": case.get("note", ""),
            }
        )
    os.environ.clear()
    os.environ.update(base_env)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    Path(spec["result"]).write_text(json.dumps({"results": results, "peak_rss_mib": peak}))


# ----------------------------------------------------------------- the parent


def run_cases(kind: str, cases: list[Case], work: Path, *, mem_mib: int = 1024, case_s: float = 10.0) -> Tally:
    """Run ``cases`` in one capped child; count what happened (see the module doc)."""
    spec = work / f"spec-{kind}.json"
    result = work / f"result-{kind}.json"
    result.unlink(missing_ok=True)
    spec.write_text(
        json.dumps({"cases": [asdict(c) for c in cases], "mem_mib": mem_mib, "case_s": case_s, "result": str(result)})
    )
    code = os.environ.get("CLUSTERCTL_FUZZ_CODE", str(ROOT))  # another checkout's clusterctl (before/after figures)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([code, os.environ.get("PYTHONPATH", "")]),
        CLUSTERCTL_SSH_CONFIG=os.environ.get("CLUSTERCTL_SSH_CONFIG", "none"),
        NO_COLOR="1",
        HOME=str(work / "home"),
    )
    (work / "home").mkdir(exist_ok=True)
    tally = Tally(kind, inputs=len(cases))
    t0 = time.monotonic()
    try:
        p = subprocess.run(
            [sys.executable, str(CHILD), str(spec)],
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
            timeout=case_s * len(cases) + 60,
        )
        crashed = p.returncode != 0 and not result.exists()
        child_err = p.stderr[-600:]
    except subprocess.TimeoutExpired:
        crashed, child_err = True, "the batch ran past its timeout"
    tally.seconds = time.monotonic() - t0
    if crashed or not result.exists():
        tally.hangs = len(cases)
        tally.failures.append({"status": "batch", "err": child_err})
        return tally
    data = json.loads(result.read_text())
    tally.peak_rss_mib = round(data["peak_rss_mib"], 1)
    tally.results = data["results"]
    for r in data["results"]:
        if r["status"] == "ok":
            tally.ok += 1
        else:
            tally.failures.append(r)
            if r["status"] == "hang":
                tally.hangs += 1
            elif r["status"] == "memory":
                tally.memory += 1
            else:
                tally.tracebacks += 1
    return tally


# ----------------------------------------------------------------- generators

HOSTILE_STRINGS = [
    "",
    " ",
    "\n",
    "a\nb",
    "x\r\ny",
    "\0",
    "\x1b[31m",
    "\u2028",
    "\u202e",
    "'",
    '"',
    "\\",
    "a\\",
    "${HOME}",
    "%n",
    "$(id)",
    "`id`",
    ";",
    "{{ x }}",
    "<script>",
    "*",
    "?",
    "[",
    "]",
    "[0:9]",
    "h[1-99999999]",
    "a" * 5000,
    "9" * 400,
    "1e400",
    "-1",
    "0x10",
    "nan",
    "inf",
    "null",
    "~",
    "&a",
    "*a",
    "!!python/object:os.system",
    "é",
    "\udcff".encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
]


def _mutate_text(rng: random.Random, text: str, n: int = 3) -> str:
    lines = text.splitlines()
    for _ in range(n):
        op = rng.randrange(7)
        i = rng.randrange(len(lines)) if lines else 0
        if op == 0 and lines:
            del lines[i]
        elif op == 1 and lines:
            lines.insert(i, lines[rng.randrange(len(lines))])
        elif op == 2 and lines:
            line = lines[i]
            j = rng.randrange(len(line) + 1)
            lines[i] = line[:j] + rng.choice(HOSTILE_STRINGS) + line[j:]
        elif op == 3 and lines:
            line = lines[i]
            j = rng.randrange(len(line) + 1)
            lines[i] = line[:j] + chr(rng.randrange(0, 0x3000)) + line[j + 1 :]
        elif op == 4:
            lines.insert(
                i,
                rng.choice(
                    [
                        "  " * rng.randrange(8) + "x: " + rng.choice(HOSTILE_STRINGS),
                        "- " * rng.randrange(1, 50) + "x",
                        "a: &a [" + "*a," * 20 + "]",
                        "[" * rng.randrange(1, 3000),
                    ]
                ),
            )
        elif op == 5 and lines:
            lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)]
        else:
            lines = lines[::-1] if rng.random() < 0.1 else lines
    return "\n".join(lines) + ("\n" if rng.random() < 0.9 else "")


BASE_INVENTORY = """\
version: 1
defaults:
  ssh: {user: ops, use_ssh_config: false}
  gpus: {count: 2, model: H100-SXM5-80GB, memory_gib: 80, interconnect: nvlink}
  labels: {rack: r1}
hosts:
  gpu[01-04]: {address: '10.0.0.[1-4]'}
  gw01: {address: 10.0.9.1}
groups:
  infer: {hosts: 'gpu[01-04]', vars: {tier: a}}
engines:
  vllm: {path: /opt/vllm/bin/vllm, version: 0.11.0}
models:
  qwen: {path: /models/qwen, served_name: Qwen/Qwen3-8B, version: '2025-06'}
instances:
  q1: {model: qwen, engine: vllm, placement: [gpu01:0], port: 8001, env: {HF_TOKEN: x, LEVEL: INFO},
       args: {max-model-len: 4096}}
templates:
  t: {model: qwen, engine: vllm, hosts: 'gpu[02-04]', tp: 1, port: 8100}
gateway:
  hosts: gw01
  port: 8080
"""


def gen_inventories(rng: random.Random, work: Path, n: int) -> list[Case]:
    cases = []
    for i in range(n):
        p = work / f"inv-{i}.yaml"
        p.write_text(_mutate_text(rng, BASE_INVENTORY, rng.randrange(1, 6)), encoding="utf-8", errors="replace")
        cases.append(Case(["inventory", "validate", "-i", str(p)]))
    return cases


_SSH_LINES = [
    "Host *",
    "Host gpu0?",
    "Match host gpu01",
    "Match exec \"touch {marker}\"",
    "Match !exec 'true' host x",
    "  User admin",
    "  Port 2200",
    "  Port notanumber",
    "  HostName h.example.com",
    "  IdentityFile ~/k",
    "  ProxyJump j",
    "  ForwardAgent yes",
    "Include *",
    "Include {dir}/*",
    "Include {dir}/fifo",
    "Include {dir}/zero",
    "Include {dir}/binary",
    "Include {dir}/self",
    "Include {dir}/big",
    "Include /nonexistent/*",
    "  %h %%",
    "Match",
    "Host",
    "  User \"unterminated",
    "Include {dir}/d/*/*",
]


def _ssh_fixtures(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    if not (d / "fifo").exists():
        os.mkfifo(d / "fifo")
    if not (d / "zero").exists():
        os.symlink("/dev/zero", d / "zero")
    (d / "binary").write_bytes(bytes(range(256)) * 64)
    (d / "big").write_text("# padding\n" * 250_000)  # 2.5 MB: over the per-file cap
    (d / "self").write_text(f"Include {d}/self\nHost *\n  User loop\n")
    (d / "d" / "x").mkdir(parents=True, exist_ok=True)
    for k in range(3):
        (d / f"star{k}").write_text("Include *\nHost *\n  User star\n")


def gen_ssh_configs(rng: random.Random, work: Path, n: int) -> list[Case]:
    d = work / "sshfix"
    _ssh_fixtures(d)
    inv = work / "ssh-inv.yaml"
    inv.write_text("version: 1\nhosts: {gpu01: {}, gpu02: {address: 10.0.0.2}}\n")
    home_ssh = work / "home" / ".ssh"
    home_ssh.mkdir(parents=True, exist_ok=True)
    for k in range(3):  # relative "Include *" resolves in ~/.ssh: three files including everything
        (home_ssh / f"c{k}").write_text("Include *\nHost *\n  User star\n")
    cases = []
    for i in range(n):
        lines = [
            rng.choice(_SSH_LINES).format(dir=d, marker=work / f"match-exec-ran-{i}")
            for _ in range(rng.randrange(1, 12))
        ]
        if rng.random() < 0.3:
            lines.insert(rng.randrange(len(lines) + 1), rng.choice(HOSTILE_STRINGS))
        cfg = work / f"ssh-{i}.conf"
        cfg.write_text("\n".join(lines) + "\n", errors="replace")
        cases.append(Case(["inventory", "validate", "-i", str(inv)], {"CLUSTERCTL_SSH_CONFIG": str(cfg)}))
    return cases


_INI_LINES = [
    "[web]",
    "[db:children]",
    "[web:vars]",
    "[all:vars]",
    "[bad",
    "web[01:99999999]",
    "h[a:z][a:z][a:z][a:z][a:z]",
    "h[0:9:0]",
    "h[9:0]",
    "h[x:y:z]",
    "h[1:]",
    "h[:3]",
    "web01 ansible_host=10.0.0.1",
    "web02 ansible_port=notaport",
    "web03:2222",
    "x=1",
    "web",
    "db",
    "ansible_user=ops",
    "web04 ansible_host=\"a b\"",
    "web05 ansible_become=maybe",
    "[web:children]",
    "web06 =",
    "= x",
]


def gen_ansible(rng: random.Random, work: Path, n: int) -> list[Case]:
    cases = []
    for i in range(n):
        if rng.random() < 0.6:
            text = "\n".join(rng.choice(_INI_LINES + HOSTILE_STRINGS[:12]) for _ in range(rng.randrange(1, 15)))
            p = work / f"ansible-{i}.ini"
        else:
            groups = {
                f"g{k}": {
                    "hosts": {
                        rng.choice(
                            [
                                "web[01:99999999]",
                                "h[a:z][a:z][a:z][a:z][a:z]",
                                "web01",
                                "db[1:3]",
                                rng.choice(HOSTILE_STRINGS) or "x",
                            ]
                        ): rng.choice(
                            [
                                None,
                                {"ansible_host": rng.choice(HOSTILE_STRINGS)},
                                {"ansible_port": rng.choice([22, "x", -1, 10**30])},
                            ]
                        )
                    },
                    "children": rng.choice([None, {f"g{(k + 1) % 3}": None}]),
                    "vars": rng.choice([None, {"x": 1}, [1, 2], "junk"]),
                }
                for k in range(3)
            }
            import yaml

            text = yaml.safe_dump(groups)
            text = _mutate_text(rng, text, rng.randrange(0, 3))
            if rng.random() < 0.1:  # a billion laughs under all.vars
                bomb = "".join(
                    f"    x{k}: &a{k} [" + ", ".join([f"*a{k - 1}" if k else "lol"] * 9) + "]\n" for k in range(10)
                )
                text = "all:\n  vars:\n" + bomb + "  hosts:\n    web01:\n      b: *a9\n"
            p = work / f"ansible-{i}.yml"
        p.write_text(text, errors="replace")
        cases.append(Case(["inventory", "import-ansible", str(p), "-o", str(work / f"ansible-out-{i}.yaml")]))
    return cases


def make_history(db: Path, runs: int = 30) -> None:
    from clusterctl.diagnose.findings import Finding, Severity
    from clusterctl.report.history import History, Metric

    with History(db) as h:
        for i in range(runs):
            h.record(
                [
                    Finding("gpu.xid", Severity.CRIT, "gpu01", "gpu:0", "XID 79"),
                    Finding("roce.pfc", Severity.WARN, f"gpu{i:02d}", "nic:eth0", "paused"),
                ],
                started=time.time() - 3600 + i,
                metrics=[Metric("gpu01", "gpu_util_pct", i, "gpu:0")],
            )
    with sqlite3.connect(db) as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")


_JUNK_SQL = [
    "DROP TABLE findings",
    "DROP TABLE runs",
    "DROP TABLE samples",
    "DROP TABLE series",
    "UPDATE runs SET started='x'",
    "UPDATE runs SET meta='[1'",
    "UPDATE runs SET meta='7'",
    "UPDATE findings SET severity='NOPE'",
    "UPDATE findings SET evidence='{'",
    "UPDATE samples SET value=NULL",
    "UPDATE samples SET value='abc'",
    "UPDATE series SET host=x'ff00'",
    "UPDATE runs SET exit_code='two'",
    "INSERT INTO runs(started, finished, pattern, exit_code, meta) VALUES (NULL, 'a', 1, 1, '{}')",
    "PRAGMA user_version=99",
    "PRAGMA user_version=-1",
    "UPDATE runs SET ok_findings=1e400",
    "DELETE FROM series",
    "UPDATE runs SET pattern=NULL",
]


def gen_history(rng: random.Random, work: Path, n: int, bundle: Path) -> list[Case]:
    seed = work / "seed.db"
    if not seed.exists():
        make_history(seed)
    cases = []
    for i in range(n):
        db = work / f"hist-{i}.db"
        data = bytearray(seed.read_bytes())
        how = rng.randrange(3)
        if how == 0:
            for _ in range(rng.randrange(1, 40)):
                j = rng.randrange(100, len(data))
                data[j] = rng.randrange(256)
            db.write_bytes(bytes(data))
        elif how == 1:
            db.write_bytes(bytes(data[: rng.randrange(0, len(data))]))
        else:
            db.write_bytes(bytes(data))
            try:
                with sqlite3.connect(db) as c:
                    for _ in range(rng.randrange(1, 4)):
                        c.execute(rng.choice(_JUNK_SQL))
            except sqlite3.Error:
                pass
        cmd = rng.choice(
            [
                ["report", "history", "--db", str(db), "--json"],
                ["report", "trends", "--db", str(db), "--days", "3650"],
                [
                    "report",
                    "run",
                    "--from",
                    str(bundle),
                    "--db",
                    str(db),
                    "--format",
                    "json",
                    "--out",
                    str(work / f"hist-out-{i}"),
                ],
            ]
        )
        cases.append(Case(cmd))
    return cases


def small_bundle(d: Path) -> Path:
    h = d / "hosts" / "gpu01"
    h.mkdir(parents=True, exist_ok=True)
    (h / "kernel.log").write_text("Nov 30 10:00:00 gpu01 kernel: NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off\n")
    return d


def gen_bundles(rng: random.Random, work: Path, n: int) -> list[Case]:
    """Directory and tar.gz bundles with junk in every file ``doctor --from`` reads (docs/bundles.md)."""
    cases = []
    for i in range(n):
        d = work / f"bundle-{i}"
        h = d / "hosts" / rng.choice(["gpu01", "x" * 200, ".", "a b"]).replace("/", "_")
        h.mkdir(parents=True, exist_ok=True)
        (d / "bundle.json").write_text(
            rng.choice(
                [
                    '{"format": "abc"}',
                    "[]",
                    '{"format": 1e400}',
                    "{" * 5000,
                    '{"format": 1, "interval_s": "x", "missing": 3}',
                    "nul\0l",
                    '{"format": 1, "hosts": ["gpu02"]}',
                    "",
                ]
            )
        )
        (h / "facts.json").write_text(
            rng.choice(
                [
                    '{"gpus": "x"}',
                    "[" * 4000,
                    '{"host": 1, "gpus": {"devices": [1]}}',
                    '{"gpus": {"devices": [{"index": "a", "remapped_rows": 7}]}}',
                    "1e400",
                    "null",
                    "\xff",
                ]
            ),
            errors="replace",
        )
        (h / "kernel.log").write_text(
            _mutate_text(rng, "NVRM: Xid (PCI:0000:3b:00): 79, pid=1\nok\n", 3), errors="replace"
        )
        (h / "metrics").mkdir(exist_ok=True)
        (h / "metrics" / "q.1.prom").write_text(
            rng.choice(
                [
                    'vllm:num_requests_running{a="' + "x" * 20000 + '"} 1',
                    "vllm:kv_cache_usage_perc 1e400",
                    "x{" * 2000,
                    "a 1\n" * 10,
                ]
            )
        )
        if rng.random() < 0.2:
            (d / "inventory.yaml").write_text(_mutate_text(rng, BASE_INVENTORY, 2), errors="replace")
        src = d
        if rng.random() < 0.4:
            tgz = work / f"bundle-{i}.tar.gz"
            with tarfile.open(tgz, "w:gz") as tar:
                tar.add(d, arcname=f"b{i}")
            raw = bytearray(tgz.read_bytes())
            if rng.random() < 0.5:
                raw = raw[: rng.randrange(10, len(raw))]
            else:
                raw[rng.randrange(10, len(raw))] ^= 1 << rng.randrange(8)
            tgz.write_bytes(bytes(raw))
            src = tgz
        cases.append(Case(["doctor", "--from", str(src), "--json"]))
    return cases


def _sse_server(bodies: list[bytes]) -> tuple[Any, int]:
    import http.server
    import socketserver
    import threading

    class H(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            parts = self.path.split("/")
            if self.command == "GET" or len(parts) < 3 or not parts[2].isdigit():
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b'{"data":[{"id":"m"}]}')
                return
            body = bodies[int(parts[2]) % len(bodies)]
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST  # noqa: N815

        def log_message(self, *a: Any) -> None:
            pass

    srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, srv.server_address[1]


def sse_bodies(rng: random.Random, n: int) -> list[bytes]:
    good = b'data: {"choices":[{"text":"hi","index":0}],"usage":null}\n\n'
    pieces = [
        good,
        b"data: [DONE]\n\n",
        b'data: {"choices":[{"text":1}]}\n\n',
        b"data: {\n\n",
        b"data: " + b"x" * 70000,
        b'data: {"usage":{"completion_tokens":1e308,"prompt_tokens":-1}}\n\n',
        b"event: error\ndata: boom\n\n",
        b"\xff\xfe\n\n",
        b":" * 1000 + b"\n",
        b'data: {"choices":[]}\n\n',
        b'data: {"choices":null}\n\n',
        b'data: {"choices":[{"text":"a","finish_reason":7}]}\n\n',
        b"data: [" * 3000 + b"\n\n",
        b"\r\r\n\n",
    ]
    return [b"".join(rng.choice(pieces) for _ in range(rng.randrange(0, 8))) for _ in range(n)]


def gen_sse(rng: random.Random, work: Path, n: int, port: int) -> list[Case]:
    """``bench`` against the SSE server of :func:`sse_server` (case i answers body i)."""
    return [
        Case(
            [
                "bench",
                f"http://127.0.0.1:{port}/c/{i}",
                "-c",
                "1",
                "-n",
                "2",
                "--input-len",
                "4",
                "--output-len",
                "4",
                "--model",
                "m",
                "--timeout",
                "3",
                "--json",
            ]
        )
        for i in range(n)
    ]


def sse_server(bodies: list[bytes]) -> tuple[Any, int]:
    """A local server answering ``POST /c/<i>/v1/completions`` with ``bodies[i]`` (call ``.shutdown()``)."""
    return _sse_server(bodies)


GENERATORS: dict[str, Callable[..., list[Case]]] = {
    "inventory": gen_inventories,
    "ssh_config": gen_ssh_configs,
    "ansible": gen_ansible,
}


if __name__ == "__main__":
    # run as a script, this folder is first on sys.path, and its http.py would shadow the standard library's
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != CHILD.parent]
    _child(sys.argv[1])
