"""Hostile inventory values never become live nginx config (issue 21).

A ``served_name`` with a newline used to be written raw into a comment of
gateway.conf: the next line was live config, and a whole injected ``server``
block passed ``nginx -t``.  The inventory refuses control characters at
validation; the renderer does not trust that and writes comments on one line.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from clusterctl.errors import InventoryError
from clusterctl.gateway.render import GatewayPaths, GatewayRenderError, render_gateway
from clusterctl.inventory.loader import load_inventory_text
from clusterctl.inventory.model import Inventory

from .conftest import INVENTORY

INJECTED = "Qwen/x\nserver { listen 127.0.0.1:18999; location / { return 200 'owned'; } }\n#"
HAS_NGINX = shutil.which("nginx") is not None and Path("/usr/share/nginx/modules/ngx_http_js_module.so").exists()


def test_inventory_refuses_a_served_name_with_a_newline_at_its_line() -> None:
    text = INVENTORY.replace("served_name: Qwen/Qwen3-8B}", 'served_name: "Qwen/x\\n}\\nserver { listen 1; }"}', 1)
    with pytest.raises(InventoryError) as e:
        load_inventory_text(text, "inv.yaml")
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "served_name" in s)
    assert f"inv.yaml:{line}: control character U+000A" in str(e.value)


def _inject(inv: Inventory) -> None:
    """As if validation had been bypassed: the served name in the gray release's and the mirror's comments."""
    assert inv.gateway is not None
    inv.gateway.gray = [replace(g, served=INJECTED) for g in inv.gateway.gray]
    inv.gateway.mirrors = [replace(m, served="llama\r\nserver { listen 18998; }") for m in inv.gateway.mirrors]


def _render_into(inv: Inventory, tmp_path: Path) -> tuple[GatewayPaths, str]:
    paths = GatewayPaths(
        conf_dir=str(tmp_path / "clusterctl"),
        nginx_conf=str(tmp_path / "nginx.conf"),
        pid_file=str(tmp_path / "nginx.pid"),
        log_dir=str(tmp_path),
        modules_include="/etc/nginx/modules-enabled/*.conf",
    )
    (tmp_path / "clusterctl").mkdir()
    conf = ""
    for f in render_gateway(inv, inv.instances, api_key="sk-test", paths=paths).files:
        Path(f.path).write_text(f.text)
        if f.path.endswith("gateway.conf"):
            conf = f.text
    return paths, conf


def test_a_value_that_slipped_past_validation_stays_inside_its_comment(inv: Inventory, tmp_path: Path) -> None:
    _inject(inv)
    _, conf = _render_into(inv, tmp_path)
    for line in conf.splitlines():
        if "listen 127.0.0.1:18999" in line or "listen 18998" in line:
            assert line.lstrip().startswith("#"), line
    assert "\r" not in conf


@pytest.mark.skipif(not HAS_NGINX, reason="nginx with njs not installed; scripts/install-deps installs it")
def test_nginx_t_sees_no_injected_server(inv: Inventory, tmp_path: Path) -> None:
    _inject(inv)
    paths, _ = _render_into(inv, tmp_path)
    p = subprocess.run(
        ["nginx", "-T", "-p", "/usr/share/nginx/", "-c", paths.nginx_conf], capture_output=True, text=True, timeout=30
    )
    assert p.returncode == 0, p.stderr
    live = [s for s in p.stdout.splitlines() if "18999" in s and not s.lstrip().startswith("#")]
    assert live == []


def test_an_address_nginx_would_interpret_is_refused(inv: Inventory) -> None:
    inv.instances["q1"].args["host"] = "10.0.0.9:1; } server { listen 18997"
    with pytest.raises(GatewayRenderError, match="cannot be written into the nginx config"):
        render_gateway(inv, inv.instances)
