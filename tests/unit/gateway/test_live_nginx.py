"""The rendered gateway on real nginx + njs (loopback): client keys, limits, mirror headers, revocation.

nginx 1.22 and njs 0.7.9 as Debian 12 ships them (``nginx-light``,
``libnginx-mod-http-js``, installed by ``scripts/install-deps``) run the
rendered files under a temporary directory; the instances are small fake
HTTP servers that record what reached them.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterctl.gateway import keys as gwkeys
from clusterctl.gateway.render import render_gateway
from clusterctl.inventory.loader import load_inventory_text
from clusterctl.inventory.model import Inventory
from clusterctl.node import gateway as node_gateway

from support.live_nginx import FakeInstance, LiveNginx, free_port, nginx_usable, post

pytestmark = pytest.mark.skipif(nginx_usable() is not None, reason=str(nginx_usable()))

UPSTREAM_KEY = "sk-instances-7f3a"


def _inventory(ports: dict[str, int], gw_port: int, admin_port: int, extra: str = "") -> Inventory:
    inst = "".join(
        f"  {n}: {{model: {'cand' if n.startswith('c') else 'tiny'}, engine: vllm, placement: [h1:{i}], port: {p}}}\n"
        for i, (n, p) in enumerate(sorted(ports.items()))
    )
    text = f"""\
version: 1
defaults:
  ssh: {{use_ssh_config: false}}
  gpus: {{count: 8, model: H100-SXM5-80GB, memory_gib: 80, interconnect: nvlink}}
hosts:
  h1: {{address: 127.0.0.1}}
engines:
  vllm: {{path: /opt/vllm/bin/vllm, version: 0.11.0}}
models:
  tiny: {{path: /models/tiny, served_name: tiny}}
  cand: {{path: /models/tiny2, served_name: tiny-2}}
instances:
{inst}gateway:
  hosts: h1
  listen: ["127.0.0.1:{gw_port}"]
  admin_port: {admin_port}
  api_key: {{env: GW_LIVE_UPSTREAM_KEY}}
  client_limits: {{requests_per_second: 100, burst: 100}}
  dispatch: least_score
{extra}"""
    return load_inventory_text(text, "inv.yaml")


class Gateway:
    def __init__(
        self, root: Path, monkeypatch: pytest.MonkeyPatch, extra: str = "", chunks: int = 1, delay_s: float = 0.0
    ):
        monkeypatch.setenv("GW_LIVE_UPSTREAM_KEY", UPSTREAM_KEY)
        self.fakes = {
            "a1": FakeInstance("a1", chunks, delay_s),
            "a2": FakeInstance("a2", chunks, delay_s),
            "c1": FakeInstance("c1", chunks, delay_s),
        }
        self.port, self.admin = free_port(), free_port()
        self.inv = _inventory({n: f.port for n, f in self.fakes.items()}, self.port, self.admin, extra)
        self.state = root / "state"
        self.nginx = LiveNginx()

    def render(self) -> Any:
        return render_gateway(
            self.inv,
            self.inv.instances,
            api_key=UPSTREAM_KEY,
            clients=gwkeys.load(self.state),
            paths=self.nginx.paths(),
        )

    def nginx_config(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin}/gateway/health", timeout=5) as r:
            return str(json.loads(r.read())["config"])

    def add(self, name: str, **limits: Any) -> str:
        key, _ = gwkeys.add(self.state, name, who="test", now="2026-12-01T00:00:00Z", **limits)
        return key

    def close(self) -> None:
        self.nginx.stop()
        for f in self.fakes.values():
            f.close()


@pytest.fixture
def gw(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    g = Gateway(tmp_path, monkeypatch)
    yield g
    g.close()


def _error(body: bytes) -> dict[str, Any]:
    err: dict[str, Any] = json.loads(body)["error"]
    return err


def test_client_key_required_and_never_passed_on(gw: Gateway) -> None:
    alice = gw.add("alice")
    gw.nginx.start(gw.render(), gw.admin)
    status, headers, body = post(gw.port, {"model": "tiny", "prompt": "x"})
    assert status == 401 and _error(body)["type"] == "AuthenticationError" and _error(body)["code"] == 401
    assert headers.get("WWW-Authenticate", "").startswith("Bearer")
    assert post(gw.port, {"model": "tiny"}, key="gk-not-a-key")[0] == 401
    assert post(gw.port, {"model": "tiny"}, key=alice[:-1])[0] == 401
    req = urllib.request.Request(f"http://127.0.0.1:{gw.port}/v1/models", headers={"Authorization": "Bearer nope"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 401
    assert sum(len(f.requests) for f in gw.fakes.values()) == 0  # nothing unauthenticated got through

    status, headers, body = post(gw.port, {"model": "tiny", "prompt": "x"}, key=alice)
    assert status == 200 and b"[DONE]" in body
    seen = [r for f in gw.fakes.values() for r in f.requests]
    assert len(seen) == 1
    # the instance gets the instances' key, never the client's, and the usual proxy headers
    assert seen[0]["headers"]["Authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert seen[0]["headers"]["X-Forwarded-For"] == "127.0.0.1"
    assert "Connection" not in seen[0]["headers"]  # Connection "": keep-alive to the instance (nginx sends "close")
    # nothing on disk or in the logs holds the key; the access log names the client
    log_file, deadline = gw.nginx.root / "log" / "gateway-access.log", time.monotonic() + 5
    while " alice [" not in log_file.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)  # nginx logs after the answer
    assert " alice [" in log_file.read_text()
    for p in [*gw.nginx.root.rglob("*"), *gw.state.rglob("*")]:
        if p.is_file():
            assert alice not in p.read_text(errors="replace"), p
    assert oct((gw.nginx.root / "conf" / "clients.json").stat().st_mode & 0o777) == "0o640"
    assert oct((gw.state / gwkeys.FILE).stat().st_mode & 0o777) == "0o600"


def test_per_key_rate_and_stream_limits_answer_429(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    g = Gateway(tmp_path, monkeypatch, chunks=3, delay_s=0.3)
    try:
        slow = g.add("slow", requests_per_second=0.1, burst=0)  # 6 per minute, none in a burst
        one = g.add("one-stream", streams=1)
        other = g.add("other")
        g.nginx.start(g.render(), g.admin)
        codes = [post(g.port, {"model": "tiny"}, key=slow)[0] for _ in range(3)]
        assert codes[0] == 200 and 429 in codes[1:]
        status, headers, body = post(g.port, {"model": "tiny"}, key=slow)
        assert status == 429 and _error(body)["type"] == "RateLimitError" and headers.get("Retry-After") == "1"
        # one stream open for "one-stream": its second is refused, another client is not limited by it
        results: list[int] = []
        t = threading.Thread(target=lambda: results.append(post(g.port, {"model": "tiny"}, key=one)[0]))
        t.start()
        time.sleep(0.3)
        status, _, body = post(g.port, {"model": "tiny"}, key=one)
        assert status == 429 and "concurrent" in _error(body)["message"]
        assert post(g.port, {"model": "tiny"}, key=other)[0] == 200
        t.join(10)
        assert results == [200]
        assert post(g.port, {"model": "tiny"}, key=one)[0] == 200
    finally:
        g.close()


def test_a_key_added_or_revoked_works_at_once_without_reload(gw: Gateway) -> None:
    first = gw.add("first")
    rendered = gw.render()
    gw.nginx.start(rendered, gw.admin)
    second = gw.add("second")
    gw.nginx.update(gw.render())
    assert gw.render().config == rendered.config == gw.nginx_config()
    assert post(gw.port, {"model": "tiny"}, key=second)[0] == 200
    gwkeys.revoke(gw.state, "first", who="test", now="2026-12-01T00:00:02Z")
    gw.nginx.update(gw.render())
    assert post(gw.port, {"model": "tiny"}, key=first)[0] == 401
    assert post(gw.port, {"model": "tiny"}, key=second)[0] == 200


def test_revocation_keeps_streams_in_flight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    g = Gateway(tmp_path, monkeypatch, chunks=6, delay_s=0.5)
    try:
        bob = g.add("bob")
        g.nginx.start(g.render(), g.admin)
        results: list[tuple[int, bytes]] = []

        def stream() -> None:
            s, _, b = post(g.port, {"model": "tiny", "stream": True}, key=bob)
            results.append((s, b))

        t = threading.Thread(target=stream)
        t.start()
        time.sleep(0.7)
        gwkeys.revoke(g.state, "bob", who="test", now="2026-12-01T00:00:01Z")
        before = g.render()
        g.nginx.update(before)  # the key file only: no reload
        assert before.config == g.nginx_config()  # nginx serves the same config: it was not reloaded
        assert post(g.port, {"model": "tiny"}, key=bob)[0] == 401
        assert [post(g.port, {"model": "tiny"}, key=bob)[0] for _ in range(5)] == [401] * 5
        assert t.is_alive()  # the stream is still running
        t.join(15)
        assert len(results) == 1 and results[0][0] == 200 and results[0][1].count(b"data: ") == 7
        assert results[0][1].rstrip().endswith(b"data: [DONE]")
    finally:
        g.close()


def test_mirror_keeps_the_inherited_headers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    g = Gateway(tmp_path, monkeypatch, extra="  mirrors:\n    - {model: tiny, candidate: cand, percent: 100}\n")
    try:
        key = g.add("carol")
        g.nginx.start(g.render(), g.admin)
        for _ in range(4):
            status, headers, _ = post(g.port, {"model": "tiny"}, key=key)
            assert status == 200 and headers["X-Gateway-Instance"] in ("a1", "a2")
        deadline = time.monotonic() + 5
        while len(g.fakes["c1"].requests) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        mirrored = g.fakes["c1"].requests
        assert len(mirrored) == 4
        for r in mirrored:
            h = r["headers"]
            assert h["X-Gateway-Mirror"] == "1"
            assert h["Authorization"] == f"Bearer {UPSTREAM_KEY}"  # was dropped: every mirror a 401
            assert h["X-Forwarded-For"] == "127.0.0.1" and h["Host"] == "127.0.0.1"
            assert "Connection" not in h
            assert json.loads(r["body"])["model"] == "tiny"
    finally:
        g.close()


def test_tls_when_a_certificate_is_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ssl
    import subprocess

    crt, key = tmp_path / "gw.crt", tmp_path / "gw.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(crt),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    g = Gateway(tmp_path, monkeypatch, extra=f"  tls: {{certificate: {{file: {crt}}}, key: {{file: {key}}}}}\n")
    try:
        from clusterctl.gateway.deploy import resolve_tls

        client = g.add("dana")
        tls = resolve_tls(g.inv)
        assert tls is not None
        rendered = render_gateway(
            g.inv, g.inv.instances, api_key=UPSTREAM_KEY, clients=gwkeys.load(g.state), tls=tls, paths=g.nginx.paths()
        )
        secret = [Path(f.path).name for f in rendered.files if f.secret and not f.remove]
        assert sorted(secret) == ["clients.json", "tls.key", "upstream-auth.conf"]
        assert "PRIVATE KEY" not in "".join(f.text for f in rendered.redacted())
        g.nginx.start(rendered, g.admin)
        ctx = ssl.create_default_context(cafile=str(crt))
        ctx.check_hostname = False
        req = urllib.request.Request(
            f"https://127.0.0.1:{g.port}/v1/completions",
            data=b'{"model": "tiny"}',
            headers={"Authorization": f"Bearer {client}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            assert r.status == 200 and b"[DONE]" in r.read()
        # plain HTTP on the TLS port: nginx's 400, nothing reaches an instance
        before = sum(len(f.requests) for f in g.fakes.values())
        assert post(g.port, {"model": "tiny"}, key=client, timeout=5)[0] == 400
        assert sum(len(f.requests) for f in g.fakes.values()) == before
    finally:
        g.close()


def _instances(g: Gateway, n: int, body: dict[str, Any] | None = None, **headers: str) -> list[str]:
    key = g.add(f"c{len(gwkeys.load(g.state))}")
    g.nginx.update(g.render())
    out = []
    for _ in range(n):
        status, h, _ = post(g.port, body or {"model": "tiny"}, key=key, headers=headers)
        assert status == 200
        out.append(h["X-Gateway-Instance"])
    return out


def _scores(g: Gateway, **inst: dict[str, Any]) -> None:
    from support.live_nginx import post_scores

    status, body = post_scores(
        g.admin, str(g.nginx.root / "conf" / "admin.token"), {"at": time.time(), "instances": inst}
    )
    assert status == 200, body


def test_least_score_picks_per_request_from_pushed_scores_without_reload(gw: Gateway) -> None:
    rendered = gw.render()
    gw.nginx.start(rendered, gw.admin)
    # a1's KV cache 90 % full, a2's empty: sequential requests (none in flight) all go to a2
    _scores(gw, a1={"load": 0.9, "step": 0.2}, a2={"load": 0.0, "step": 0.2}, c1={"load": 0.0, "step": 0.2})
    assert _instances(gw, 4) == ["a2"] * 4
    assert gw.nginx_config() == rendered.config  # scores changed nothing nginx loads: no reload
    # fresh scores reset the counts; a2 now down (a hung engine, say): none of 10 go there
    _scores(
        gw,
        a1={"load": 0.5, "step": 0.01},
        a2={"load": 0.0, "step": 0.01, "down": True, "reason": "hung"},
        c1={"load": 0.0, "step": 0.01},
    )
    assert set(_instances(gw, 10)) == {"a1"}
    _scores(gw, a1={"load": 0.0, "step": 0.01}, a2={"load": 0.0, "step": 0.01}, c1={"load": 0.0, "step": 0.01})
    assert set(_instances(gw, 20)) == {"a1", "a2"}  # equal scores: both get requests
    # equal occupancy: the faster GPU (measured capacity) wins
    _scores(
        gw,
        a1={"load": 0.0, "step": 0.25, "cap": 0.4},
        a2={"load": 0.0, "step": 0.25, "cap": 1.0},
        c1={"load": 0.0, "step": 0.25},
    )
    assert _instances(gw, 5) == ["a2"] * 5


def test_least_score_sessions_stay_unless_their_instance_is_overloaded(gw: Gateway) -> None:
    gw.nginx.start(gw.render(), gw.admin)
    _scores(gw, a1={"load": 0.2, "step": 0.01}, a2={"load": 0.3, "step": 0.01}, c1={"load": 0.0, "step": 0.01})
    homes = {s: _instances(gw, 3, **{"X-Session-ID": s}) for s in (f"sess-{i}" for i in range(8))}
    assert all(len(set(v)) == 1 for v in homes.values())  # a session keeps its instance
    assert {v[0] for v in homes.values()} == {"a1", "a2"}  # and sessions spread over both
    on_a2 = next(s for s, v in homes.items() if v[0] == "a2")
    _scores(gw, a1={"load": 0.2, "step": 0.01}, a2={"load": 1.2, "step": 0.01}, c1={"load": 0.0, "step": 0.01})
    assert _instances(gw, 2, **{"X-Session-ID": on_a2}) == ["a1", "a1"]  # overloaded: spills to the lowest
    _scores(gw, a1={"load": 0.2, "step": 0.01}, a2={"load": 0.3, "step": 0.01}, c1={"load": 0.0, "step": 0.01})
    assert _instances(gw, 1, **{"X-Session-ID": on_a2}) == ["a2"]  # and comes back


def test_scores_endpoint_needs_the_admin_token(gw: Gateway) -> None:
    gw.nginx.start(gw.render(), gw.admin)
    req = urllib.request.Request(
        f"http://127.0.0.1:{gw.admin}/gateway/scores",
        data=b'{"at": 1, "instances": {}}',
        headers={"X-Gateway-Admin": "guess"},
    )
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 403
    assert post(gw.port, {"at": 1}, path="/gateway/scores")[0] == 404  # not on the public port


def _in_flight(picks: Path, name: str) -> tuple[int, int]:
    """(requests, work units) the gateway counts in flight on NAME, over its generation directories."""
    n = w = 0
    for d in picks.iterdir():
        size = lambda f: (d / f).stat().st_size if (d / f).exists() else 0  # noqa: E731
        n += size(name + ".n") - size(name + ".n.d")
        w += size(name + ".w") - size(name + ".w.d")
    return n, w


def test_least_score_counts_requests_in_flight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each request counts for its instance (one request, its work in units) while it runs and
    stops when it ends; a scores post keeps the generation of running requests and deletes a
    finished one."""
    g = Gateway(tmp_path, monkeypatch, chunks=4, delay_s=0.4)
    try:
        key = g.add("e")
        g.nginx.start(g.render(), g.admin)
        _scores(g, a1={"load": 0.0, "step": 0.5}, a2={"load": 0.0, "step": 0.5}, c1={"load": 0.0, "step": 0.5})
        seen: list[str] = []
        body = {"model": "tiny", "max_tokens": 40, "prompt": "x" * 1024}  # 40 + 1024/4/64 tokens: 3 units of 16
        threads = [
            threading.Thread(target=lambda: seen.append(post(g.port, body, key=key)[1]["X-Gateway-Instance"]))
            for _ in range(4)
        ]
        for t in threads:
            t.start()
            time.sleep(0.15)
        picks = g.nginx.root / "state" / "picks"
        # scores arrive while all four run: their generation stays, every count stays
        _scores(g, a1={"load": 0.0, "step": 0.5}, a2={"load": 0.0, "step": 0.5}, c1={"load": 0.0, "step": 0.5})
        assert _in_flight(picks, "a1") == (2, 6) and _in_flight(picks, "a2") == (2, 6)
        for t in threads:
            t.join(10)
        assert sorted(seen) == ["a1", "a1", "a2", "a2"]  # each request in flight counts: 2 and 2 (2 seats each)
        deadline = time.monotonic() + 5
        while (_in_flight(picks, "a1"), _in_flight(picks, "a2")) != ((0, 0), (0, 0)) and time.monotonic() < deadline:
            time.sleep(0.05)  # nginx logs (and so records the end) just after the answer: wait for both
        assert _in_flight(picks, "a1") == (0, 0) and _in_flight(picks, "a2") == (0, 0)
        before = {d.name for d in picks.iterdir()}
        _scores(g, a1={"load": 0.0, "step": 0.5}, a2={"load": 0.0, "step": 0.5}, c1={"load": 0.0, "step": 0.5})
        after = {d.name for d in picks.iterdir()}
        assert len(after) == 1 and not after & before  # the finished generation is deleted, a new one begun
        assert not list((picks / after.pop()).iterdir())
        # the KV term: a1's cache 90 % full (no free seat) loses to one request in flight elsewhere
        _scores(g, a1={"load": 0.9, "step": 0.5}, a2={"load": 0.0, "step": 0.5}, c1={"load": 0.0, "step": 0.5})
        assert _instances(g, 1) == ["a2"]
    finally:
        g.close()


def test_least_score_sends_to_the_least_outstanding_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With free seats on both, a long request in flight on one sends the next requests to the other
    (least_conn would alternate)."""
    g = Gateway(tmp_path, monkeypatch, chunks=6, delay_s=0.5)
    try:
        key = g.add("e")
        g.nginx.start(g.render(), g.admin)
        _scores(g, a1={"load": 0.0, "step": 0.1}, a2={"load": 0.0, "step": 0.1}, c1={"load": 0.0, "step": 0.1})
        seen: list[str] = []
        long = threading.Thread(
            target=lambda: seen.append(
                post(g.port, {"model": "tiny", "max_tokens": 2000}, key=key)[1]["X-Gateway-Instance"]
            )
        )
        long.start()
        picks = g.nginx.root / "state" / "picks"
        deadline = time.monotonic() + 5
        while not any(_in_flight(picks, n)[0] for n in ("a1", "a2")) and time.monotonic() < deadline:
            time.sleep(0.02)
        busy = "a1" if _in_flight(picks, "a1")[0] else "a2"
        assert _in_flight(picks, busy) == (1, 125)  # 2000 tokens in units of 16
        shorts: list[str] = []
        threads = [
            threading.Thread(
                target=lambda: shorts.append(
                    post(g.port, {"model": "tiny", "max_tokens": 16}, key=key)[1]["X-Gateway-Instance"]
                )
            )
            for _ in range(3)
        ]
        for t in threads:
            t.start()
            time.sleep(0.1)
        for t in (*threads, long):
            t.join(10)
        assert seen == [busy] and shorts == [{"a1": "a2", "a2": "a1"}[busy]] * 3, (seen, shorts)
    finally:
        g.close()


def test_least_score_max_conns_per_instance_then_a_503_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gateway.max_conns is counted by the router per instance (nginx's per-upstream count cannot see
    the backups' connections): with 1, two requests in flight fill a1 and a2, a third is a 503 JSON
    at once rather than a second request on either; once they end, requests pass again.  The two
    are sent one after the other (each in flight before the next): two picked at the same instant
    by two nginx workers may both take a1's last slot (docs/gateway.md, max_conns)."""
    g = Gateway(tmp_path, monkeypatch, extra="  max_conns: 1\n", chunks=4, delay_s=0.5)
    try:
        key = g.add("e")
        g.nginx.start(g.render(), g.admin)
        seen: list[str] = []
        threads = [
            threading.Thread(
                target=lambda: seen.append(
                    post(g.port, {"model": "tiny", "max_tokens": 40}, key=key)[1]["X-Gateway-Instance"]
                )
            )
            for _ in range(2)
        ]
        picks = g.nginx.root / "state" / "picks"
        for sent, t in enumerate(threads, start=1):
            t.start()
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                if picks.exists() and sum(_in_flight(picks, n)[0] for n in ("a1", "a2")) >= sent:
                    break
                time.sleep(0.02)
        assert [_in_flight(picks, n)[0] for n in ("a1", "a2")] == [1, 1]
        t0 = time.monotonic()
        status, _, body = post(g.port, {"model": "tiny", "max_tokens": 4}, key=key)
        assert status == 503 and time.monotonic() - t0 < 1, (status, body)
        assert "all at their connection limit or down" in _error(body)["message"]
        for t in threads:
            t.join(10)
        assert sorted(seen) == ["a1", "a2"]
        deadline = time.monotonic() + 5
        while sum(_in_flight(picks, n)[0] for n in ("a1", "a2")) and time.monotonic() < deadline:
            time.sleep(0.02)  # the ends are recorded when nginx logs them
        assert post(g.port, {"model": "tiny", "max_tokens": 4}, key=key)[0] == 200
    finally:
        g.close()


def test_a_reload_is_confirmed_once_no_old_worker_accepts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The node program's wait after a reload (``confirm_config``): it returns once every worker of
    the old generation is gone or shutting down and one health answer has the new config, without
    waiting for an old worker's stream in flight; every fresh connection after it sees the new config."""
    g = Gateway(tmp_path, monkeypatch, chunks=10, delay_s=0.3)
    try:
        bob = g.add("bob")
        g.nginx.start(g.render(), g.admin)
        old = node_gateway._workers(g.nginx.paths().pid_file)
        assert old, "the master's workers are read from /proc"
        results: list[tuple[int, dict[str, str], bytes]] = []
        t = threading.Thread(target=lambda: results.append(post(g.port, {"model": "tiny", "stream": True}, key=bob)))
        t.start()
        time.sleep(0.5)
        new = render_gateway(
            g.inv,
            {n: i for n, i in g.inv.instances.items() if n != "a2"},
            api_key=UPSTREAM_KEY,
            clients=gwkeys.load(g.state),
            paths=g.nginx.paths(),
        )
        assert new.config != g.nginx_config()
        g.nginx.write(new)
        t0 = time.monotonic()
        assert g.nginx._nginx("-s", "reload").returncode == 0
        seen = node_gateway.confirm_config(g.admin, new.config, old, wait_s=10)
        took = time.monotonic() - t0
        assert seen["ok"], seen
        assert t.is_alive(), "the old worker's stream is still running: its exit was not waited for"
        assert node_gateway._still_accepting(old) == []
        fresh = []
        for _ in range(20):
            with urllib.request.urlopen(f"http://127.0.0.1:{g.admin}/gateway/health", timeout=5) as r:
                fresh.append(json.loads(r.read())["config"])
        assert fresh == [new.config] * 20
        t.join(15)
        assert results and results[0][0] == 200 and results[0][2].rstrip().endswith(b"data: [DONE]")
        print(f"reload confirmed in {took:.3f} s after {seen['polls']} health request(s)")
    finally:
        g.close()
