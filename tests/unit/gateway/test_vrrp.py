"""gateway.vip: the inventory section, keepalived's files per host, the password kept out of sight."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clusterctl.errors import ConfigError, InventoryError
from clusterctl.gateway.deploy import resolve_vrrp_password, secret_inputs
from clusterctl.gateway.render import GatewayRenderError, render_gateway
from clusterctl.gateway.vrrp import CHECK, CONF
from clusterctl.inventory.loader import load_inventory_text
from clusterctl.inventory.model import Inventory

from .conftest import INVENTORY

VIP = """\
gateway:
  hosts: 'gw[01-03]'
  port: 8080
  admin_port: 18081
  vip:
    address: 10.0.0.100/24
    interface: eth0
    router_id: 42
    password: {env: GW_VRRP_PASS}
"""


def _inv(gateway_yaml: str = VIP) -> Inventory:
    text = INVENTORY[: INVENTORY.index("gateway:")] + gateway_yaml
    text = text.replace("  gw01: {address: 10.0.0.1}\n", "  gw[01-03]: {address: '10.0.0.[1-3]'}\n")
    return load_inventory_text(text, "inv.yaml")


def _errors(gateway_yaml: str) -> str:
    with pytest.raises(InventoryError) as e:
        _inv(gateway_yaml)
    return str(e.value)


def test_vip_values() -> None:
    vip = _inv().gateway.vip  # type: ignore[union-attr]
    assert vip is not None
    assert (vip.address, vip.prefix, vip.interface, vip.router_id, vip.advert_s) == ("10.0.0.100", 24, "eth0", 42, 1)
    assert vip.password is not None and (vip.password.kind, vip.password.ref) == ("env", "GW_VRRP_PASS")


@pytest.mark.parametrize(
    "gateway_yaml, message",
    [
        (
            "gateway:\n  hosts: gw01\n  vip: {address: 10.0.0.100, interface: eth0}\n",
            "inv.yaml:21: gateway.vip: a floating address needs two or more gateway hosts",
        ),
        ("gateway:\n  hosts: 'gw[01-02]'\n  vip: {interface: eth0}\n", "gateway.vip: missing 'address'"),
        (
            "gateway:\n  hosts: 'gw[01-02]'\n  vip: {address: 10.0.0.300, interface: eth0}\n",
            "gateway.vip.address: '10.0.0.300' is not an IPv4 address",
        ),
        (
            "gateway:\n  hosts: 'gw[01-02]'\n  vip: {address: 10.0.0.2, interface: eth0}\n",
            "gateway.vip.address: 10.0.0.2 is host 'gw02''s own address",
        ),
        (
            "gateway:\n  hosts: 'gw[01-02]'\n  vip: {address: 10.0.0.100, interface: 'eth0; rm'}\n",
            "is not an interface name",
        ),
        (
            "gateway:\n  hosts: 'gw[01-02]'\n  vip: {address: 10.0.0.100, interface: eth0, router_id: 256}\n",
            "gateway.vip.router_id: 256 is out of range",
        ),
        (
            "gateway:\n  hosts: 'gw[01-02]'\n  listen: [10.0.0.1]\n  vip: {address: 10.0.0.100, interface: eth0}\n",
            "nginx must listen on every address",
        ),
    ],
)
def test_vip_errors_name_the_line(gateway_yaml: str, message: str) -> None:
    assert message in _errors(gateway_yaml)


def test_a_gateway_host_named_by_dns_cannot_be_a_unicast_peer() -> None:
    text = (
        INVENTORY[: INVENTORY.index("gateway:")]
        + "gateway:\n  hosts: 'gw[01-02]'\n  vip: {address: 10.0.0.100, interface: eth0}\n"
    )
    text = text.replace(
        "  gw01: {address: 10.0.0.1}\n", "  gw01: {address: gw01.example}\n  gw02: {address: 10.0.0.2}\n"
    )
    with pytest.raises(InventoryError) as e:
        load_inventory_text(text, "inv.yaml")
    assert "gateway host 'gw01' has address 'gw01.example'; unicast VRRP needs" in str(e.value)


def test_keepalived_files_per_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GW_VRRP_PASS", "s3cr3t!x")
    inv = _inv()
    r = render_gateway(inv, inv.instances, **secret_inputs(inv, Path("/nonexistent")))
    assert sorted(r.vrrp) == ["gw01", "gw02", "gw03"]
    confs = {h: {f.path: f for f in fs} for h, fs in r.vrrp.items()}
    c1, c3 = confs["gw01"][CONF], confs["gw03"][CONF]
    assert c1.mode == 0o600 and c1.secret and confs["gw01"][CHECK].mode == 0o755
    # unicast to the other two, from its own address; priority by the order of gateway.hosts
    assert "unicast_src_ip 10.0.0.1\n" in c1.text and "10.0.0.2\n" in c1.text and "10.0.0.3\n" in c1.text
    assert "unicast_src_ip 10.0.0.3\n" in c3.text and "        10.0.0.3\n" not in c3.text
    assert "priority 200\n" in c1.text and "priority 180\n" in c3.text
    for text in (c1.text, c3.text):
        assert "state BACKUP\n    nopreempt\n" in text and "virtual_router_id 42\n" in text
        assert "10.0.0.100/24 dev eth0\n" in text and "auth_pass s3cr3t!x\n" in text
        assert f'script "{CHECK}"' in text and "script_user root" in text and "enable_script_security" in text
    assert "/dev/tcp/127.0.0.1/18081" in confs["gw02"][CHECK].text
    # nginx's config (what /gateway/health serves) does not depend on keepalived's files,
    # the applied digest does (sync re-applies a changed floating address)
    monkeypatch.setenv("GW_VRRP_PASS", "other")
    r2 = render_gateway(inv, inv.instances, **secret_inputs(inv, Path("/nonexistent")))
    assert r2.config == r.config and r2.digest != r.digest


def test_the_password_is_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GW_VRRP_PASS", "s3cr3t!x")
    inv = _inv()
    r = render_gateway(inv, inv.instances, **secret_inputs(inv, Path("/nonexistent")))
    shown = r.redacted_vrrp()
    for fs in shown.values():
        for f in fs:
            assert "s3cr3t" not in f.text and "s3cr3t" not in repr(f)
    assert "auth_pass ***\n" in {f.path: f for f in shown["gw01"]}[CONF].text
    # without the value (render for showing) the file says *** too
    plain = render_gateway(inv, inv.instances)
    assert "auth_pass ***\n" in {f.path: f for f in plain.vrrp["gw02"]}[CONF].text


def test_a_password_keepalived_would_cut_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GW_VRRP_PASS", "too-long-x9")
    inv = _inv()
    with pytest.raises(GatewayRenderError, match="1-8 printable characters") as e:
        render_gateway(inv, inv.instances, **secret_inputs(inv, Path("/nonexistent")))
    assert "too-long" not in str(e.value)
    monkeypatch.delenv("GW_VRRP_PASS")
    with pytest.raises(ConfigError, match=r"inv.yaml:\d+: gateway.vip.password: environment variable GW_VRRP_PASS"):
        resolve_vrrp_password(inv)


def test_no_vip_no_keepalived_files(inv: Inventory) -> None:
    assert render_gateway(inv, inv.instances).vrrp == {}


def _check_script(tmp_path: Path, port: int) -> Path:
    from clusterctl.gateway.vrrp import check_script

    p = tmp_path / "check"
    p.write_text(check_script(port, 1))
    p.chmod(0o755)
    return p


def test_the_check_script_follows_the_local_health_endpoint(tmp_path: Path) -> None:
    """The track script keepalived runs: 0 while /gateway/health answers 200, 1 on 503 or nothing."""
    server = tmp_path / "srv.py"
    server.write_text(
        "import http.server, sys\n"
        "code = int(sys.argv[1])\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(code if self.path == '/gateway/health' else 404); self.end_headers()\n"
        "        self.wfile.write(b'{}')\n"
        "    def log_message(self, *a): pass\n"
        "s = http.server.HTTPServer(('127.0.0.1', 0), H)\n"
        "print(s.server_address[1], flush=True)\n"
        "s.serve_forever()\n"
    )
    for code, want in ((200, 0), (503, 1)):
        p = subprocess.Popen([sys.executable, str(server), str(code)], stdout=subprocess.PIPE, text=True)
        try:
            port = int(p.stdout.readline())  # type: ignore[union-attr]
            rc = subprocess.run([str(_check_script(tmp_path, port))], timeout=10).returncode
        finally:
            p.kill()
            p.wait()
        assert rc == want, (code, rc)
    # nothing listening: a failed check, quickly
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    assert subprocess.run([str(_check_script(tmp_path, port))], timeout=10, stderr=subprocess.DEVNULL).returncode == 1


def test_node_messages_hide_the_password() -> None:
    from clusterctl.node import gateway as node

    files = [{"path": CONF, "text": "x\n    auth_pass s3cr3t!x\n", "mode": 0o600}]
    assert node._secret_free("line 9: auth_pass s3cr3t!x too long", files) == "line 9: auth_pass *** too long"
