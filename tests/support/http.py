"""HTTP helpers for tests that talk to simulator instances on lab hosts."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any


def http(
    url: str, body: dict | None = None, timeout: float = 30, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """GET (or POST ``body`` as JSON) ``url``: ``(status, body)``, HTTP errors included."""
    req = urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_healthy(lab: Any, host: str, url: str, unit: str, timeout: float) -> None:
    """Poll ``url`` until it answers 200; past ``timeout`` seconds fail with the unit's journal."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if http(url, timeout=2)[0] == 200:
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, lab.run(host, f"journalctl -u {unit} --no-pager").stdout
        time.sleep(0.5)
