"""``drift leak`` through a gateway (the request names the model) and over instance globs."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from clusterctl.cli.main import main
from clusterctl.exitcodes import ExitCode


class Gateway:
    """Routes by the request's ``model`` like the nginx gateway: no model is a 404 naming `undefined`."""

    def __init__(self, models: list[str]) -> None:
        self.models, self.seen = models, []
        gw = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def _send(self, code: int, doc: Any) -> None:
                body = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._send(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in gw.models]})

            def do_POST(self) -> None:
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                gw.seen.append(req.get("model"))
                if req.get("model") not in gw.models:
                    return self._send(
                        404, {"error": {"message": f"model `{req.get('model', 'undefined')}` does not exist"}}
                    )
                self._send(
                    200,
                    {
                        "choices": [
                            {
                                "text": " fine",
                                "logprobs": {
                                    "tokens": [" fine"],
                                    "top_logprobs": [{" fine": -0.1}],
                                    "text_offset": [0],
                                },
                            }
                        ]
                    },
                )

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def gateway() -> Iterator[Any]:
    made: list[Gateway] = []

    def make(models: list[str]) -> Gateway:
        made.append(Gateway(models))
        return made[-1]

    yield make
    for g in made:
        g.close()


def test_leak_through_a_gateway_names_the_model(gateway, capsys: pytest.CaptureFixture[str]) -> None:
    gw = gateway(["tiny", "qwen3-8b"])
    # Two models behind the gateway: which one must be said, not guessed.
    assert main(["drift", "leak", gw.url, "--sessions", "2", "--requests", "1", "--json"]) == ExitCode.UNKNOWN
    out = json.loads(capsys.readouterr().out)
    assert "serves 2 models (tiny, qwen3-8b): give --model" in out["errors"][0] and gw.seen == []
    assert (
        main(["drift", "leak", gw.url, "--model", "qwen3-8b", "--sessions", "2", "--requests", "2", "--json"])
        == ExitCode.OK
    )
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "qwen3-8b" and out["requests"] == 4 and out["sightings"] == []
    assert set(gw.seen) == {"qwen3-8b"}
    assert main(["drift", "leak", gw.url, "--model", "nope", "--json"]) == ExitCode.UNKNOWN
    assert "model 'nope' is not served" in json.loads(capsys.readouterr().out)["errors"][0]
    # One model listed: that one, without --model.
    one = gateway(["tiny"])
    assert main(["drift", "leak", one.url, "--sessions", "2", "--requests", "1"]) == ExitCode.OK
    assert f"{one.url} (model tiny): OK" in capsys.readouterr().out and set(one.seen) == {"tiny"}


def test_leak_over_instance_globs_checks_each_instance(
    gateway, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = gateway(["tiny"]), gateway(["tiny"])
    inv = tmp_path / "site.yaml"
    inv.write_text(f"""version: 1
hosts:
  h1: {{address: 127.0.0.1, gpus: {{count: 4, model: H100-80GB, memory_gib: 80}}}}
engines:
  e: {{path: /opt/vllm/bin/vllm, version: 0.11.0}}
models:
  tiny: {{path: /models/tiny}}
instances:
  pool-1: {{model: tiny, engine: e, placement: "h1:0", port: {a.url.rsplit(':', 1)[1]}}}
  pool-2: {{model: tiny, engine: e, placement: "h1:1", port: {b.url.rsplit(':', 1)[1]}}}
  other: {{model: tiny, engine: e, placement: "h1:2", port: 9}}
""")
    assert (
        main(["drift", "leak", "pool-*", "-i", str(inv), "--sessions", "2", "--requests", "1", "--json"]) == ExitCode.OK
    )
    out = json.loads(capsys.readouterr().out)
    assert [t["target"] for t in out["targets"]] == ["pool-1", "pool-2"] and out["status"] == "OK"
    assert a.seen and b.seen
    assert main(["drift", "leak", "nomatch-*", "-i", str(inv)]) == 3
    assert "matches no instance" in capsys.readouterr().err
