"""Real nginx (+ njs) on loopback, running the rendered gateway, in front of small fake instances.

Used by ``tests/unit/gateway/test_live_nginx.py`` and the dispatch benchmark: the
rendered files go under a temporary directory (``GatewayPaths``), nginx runs
in the foreground as root (workers as www-data, as on a gateway host) and is
reloaded with ``nginx -s reload``.  The fake instance answers
``/v1/completions`` (optionally streaming, slowly) and records each request's
headers, so tests can see what the gateway passed on.
"""

from __future__ import annotations

import grp
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from clusterctl.gateway.render import GatewayPaths, RenderedGateway

NJS = Path("/usr/share/nginx/modules/ngx_http_js_module.so")


def nginx_usable() -> str | None:
    """Why real nginx cannot run here (``None``: it can)."""
    if shutil.which("nginx") is None or not NJS.exists():
        return "nginx with njs (libnginx-mod-http-js) not installed; scripts/install-deps installs it"
    if os.geteuid() != 0:
        return "real nginx as a gateway needs root (workers run as www-data)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeInstance:
    """An OpenAI-style instance on 127.0.0.1: records requests; ``delay_s`` per streamed chunk."""

    def __init__(self, name: str, chunks: int = 1, delay_s: float = 0.0):
        self.name, self.chunks, self.delay_s = name, chunks, delay_s
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # as uvicorn (and the simulator): no delayed-ACK stalls

            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n)
                with outer.lock:
                    outer.requests.append({"path": self.path, "headers": dict(self.headers.items()), "body": body})
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i in range(outer.chunks):
                    if outer.delay_s:
                        time.sleep(outer.delay_s)
                    data = f"data: {json.dumps({'instance': outer.name, 'i': i})}\n\n".encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                done = b"data: [DONE]\n\n"
                self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
                self.wfile.flush()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class LiveNginx:
    """nginx running ``rendered`` (rendered with :meth:`paths`) from a fresh directory the
    workers (www-data) can reach (pytest's own temporary directories are 0700); removed by :meth:`stop`."""

    def __init__(self) -> None:
        self.root = root = Path(tempfile.mkdtemp(prefix="clusterctl-gw-"))
        os.chmod(root, 0o755)
        (root / "conf").mkdir(parents=True, exist_ok=True)
        (root / "log").mkdir(exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None

    def paths(self) -> GatewayPaths:
        return GatewayPaths(
            conf_dir=str(self.root / "conf"),
            nginx_conf=str(self.root / "nginx.conf"),
            pid_file=str(self.root / "nginx.pid"),
            log_dir=str(self.root / "log"),
            modules_include="/etc/nginx/modules-enabled/*.conf",
            state_dir=str(self.root / "state"),
        )

    def write(self, rendered: RenderedGateway) -> None:
        for f in rendered.files:
            p = Path(f.path)
            if f.remove:
                p.unlink(missing_ok=True)
                continue
            tmp = p.with_name(f".{p.name}.tmp")
            tmp.write_text(f.text)
            os.chown(tmp, 0, grp.getgrnam(f.group).gr_gid)
            os.chmod(tmp, f.mode)
            tmp.rename(p)

    def _nginx(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["nginx", "-p", "/usr/share/nginx/", "-c", str(self.root / "nginx.conf"), *args],
            capture_output=True,
            text=True,
            timeout=30,
        )

    def start(self, rendered: RenderedGateway, admin_port: int) -> None:
        from clusterctl.node.gateway import ensure_runtime

        self.write(rendered)
        ensure_runtime({"runtime": rendered.runtime})  # what gateway deploy's node program does
        t = self._nginx("-t")
        assert t.returncode == 0, t.stderr
        self.proc = subprocess.Popen(
            ["nginx", "-p", "/usr/share/nginx/", "-c", str(self.root / "nginx.conf"), "-g", "daemon off;"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.wait_config(rendered, admin_port)

    def update(self, rendered: RenderedGateway) -> None:
        """Write only the files njs reads per request (``live``): what a key change does, no reload."""
        self.write(RenderedGateway(tuple(f for f in rendered.files if f.live), rendered.digest))

    def reload(self, rendered: RenderedGateway, admin_port: int) -> None:
        self.write(rendered)
        r = self._nginx("-s", "reload")
        assert r.returncode == 0, r.stderr
        self.wait_config(rendered, admin_port)

    def wait_config(self, rendered: RenderedGateway, admin_port: int, timeout: float = 10.0) -> None:
        want, agree, deadline = rendered.config, 0, time.monotonic() + timeout
        while agree < 8:
            assert time.monotonic() < deadline, f"nginx does not serve config {want}: {self.error_log()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/gateway/health", timeout=2) as r:
                    agree = agree + 1 if json.loads(r.read()).get("config") == want else 0
            except (OSError, ValueError):
                agree = 0
                time.sleep(0.05)

    def error_log(self) -> str:
        p = self.root / "log" / "error.log"
        return p.read_text()[-3000:] if p.exists() else ""

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
            self.proc = None
        shutil.rmtree(self.root, ignore_errors=True)


def post_scores(admin_port: int, token_file: str, scores: dict[str, Any]) -> tuple[int, bytes]:
    """What ``gateway sync`` does on the host: POST the scores with the admin token."""
    from clusterctl.node.gateway import scores as node_scores

    a = node_scores({"port": admin_port, "token": token_file, "scores": scores})
    return (200, json.dumps(a).encode()) if a.get("ok") else (0, str(a.get("error")).encode())


def post(
    port: int,
    body: dict[str, Any],
    key: str | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
    path: str = "/v1/completions",
) -> tuple[int, dict[str, str], bytes]:
    """POST JSON through the gateway: ``(status, headers, body)``, HTTP errors included."""
    h = {"Content-Type": "application/json", **(headers or {})}
    if key is not None:
        h["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), headers=h)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers.items()), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers.items()), e.read()
