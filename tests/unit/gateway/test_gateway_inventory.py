"""The gateway: section: defaults, values and file:line errors."""

from __future__ import annotations

import pytest

from clusterctl.errors import InventoryError
from clusterctl.inventory.loader import load_inventory_text
from clusterctl.inventory.model import Inventory

from .conftest import INVENTORY


def _errors(gateway_yaml: str) -> str:
    text = INVENTORY[: INVENTORY.index("gateway:")] + gateway_yaml
    with pytest.raises(InventoryError) as e:
        load_inventory_text(text, "inv.yaml")
    return str(e.value)


def test_values_and_served_names(inv: Inventory) -> None:
    gw = inv.gateway
    assert gw is not None
    assert gw.hosts == ("gw01",) and gw.port == 8080 and gw.max_conns == 4
    assert gw.session_header == "X-Session-ID"
    assert (gw.max_connections, gw.requests_per_second, gw.burst) == (100, 50.0, 20)
    assert gw.api_key is not None and (gw.api_key.kind, gw.api_key.ref) == ("env", "GW_TEST_KEY")
    assert [(g.served, g.stable, g.canary, g.percent) for g in gw.gray] == [("Qwen/Qwen3-8B", "qwen", "qwen-v2", 10.0)]
    assert [(m.served, m.candidate, m.percent) for m in gw.mirrors] == [("llama", "qwen-v2", 5.0)]


def test_no_section_means_no_gateway() -> None:
    text = INVENTORY[: INVENTORY.index("gateway:")]
    assert load_inventory_text(text, "inv.yaml").gateway is None


@pytest.mark.parametrize(
    "body, message",
    [
        ("gateway:\n  port: 8080\n", "inv.yaml:20: gateway: missing 'hosts'"),
        ("gateway:\n  hosts: gw09\n", "inv.yaml:20: gateway.hosts: host 'gw09' is not defined in 'hosts'"),
        ("gateway:\n  hosts: gw01\n  port: 70000\n", "inv.yaml:21: gateway.port: 70000 is out of range"),
        (
            "gateway:\n  hosts: gw01\n  session_header: 'X Session'\n",
            "inv.yaml:21: gateway.session_header: 'X Session' is not an HTTP header name",
        ),
        ("gateway:\n  hosts: gw01\n  limits: {rps: 3}\n", "inv.yaml:21: gateway.limits: unknown key 'rps'"),
        ("gateway:\n  hosts: gw01\n  api_key: {env: A, file: b}\n", "inv.yaml:21: gateway.api_key: give exactly one"),
        (
            "gateway:\n  hosts: gw01\n  gray:\n    - {stable: qwen, canary: nope, percent: 10}\n",
            "inv.yaml:22: gateway.gray.canary: model 'nope' is not defined in 'models'",
        ),
        (
            "gateway:\n  hosts: gw01\n  gray:\n    - {stable: qwen, canary: qwen-v2, percent: 120}\n",
            "inv.yaml:22: gateway.gray.percent: 120 is not within 0-100",
        ),
        (
            "gateway:\n  hosts: gw01\n  mirrors:\n    - {model: llama, candidate: qwen-v2, percent: 5}\n"
            "    - {model: llama, candidate: qwen, percent: 5}\n",
            "inv.yaml:23: gateway.mirrors: 'llama' has an entry already (line 22)",
        ),
        (
            "gateway:\n  hosts: gw01\n  mirrors:\n    - {model: llama, percent: 5}\n",
            "inv.yaml:22: gateway.mirrors: missing 'candidate'",
        ),
        ("gateway:\n  hosts: gw01\n  auth: maybe\n", "inv.yaml:21: gateway.auth: 'maybe' is not one of keys, none"),
        (
            "gateway:\n  hosts: gw01\n  listen: [gw.example.com]\n",
            "inv.yaml:21: gateway.listen: 'gw.example.com' is not",
        ),
        ("gateway:\n  hosts: gw01\n  listen: ['10.0.0.1:99999']\n", "inv.yaml:21: gateway.listen: '10.0.0.1:99999'"),
        ("gateway:\n  hosts: gw01\n  listen: ['127.0.0.1:18080']\n", "gateway.admin_port: 18080 is also a listen port"),
        ("gateway:\n  hosts: gw01\n  tls: {certificate: {file: a.pem}}\n", "inv.yaml:21: gateway.tls: give both"),
        ("gateway:\n  hosts: gw01\n  dispatch: random\n", "inv.yaml:21: gateway.dispatch: 'random' is not one of"),
        (
            "gateway:\n  hosts: gw01\n  client_limits: {streams: -1}\n",
            "inv.yaml:21: gateway.client_limits.streams: -1 is out of range",
        ),
    ],
)
def test_errors_name_file_and_line(body: str, message: str) -> None:
    assert message in _errors(body)


def test_security_defaults_and_values(inv: Inventory) -> None:
    gw = inv.gateway
    assert gw is not None
    assert gw.auth == "keys" and gw.listen_addresses() == (("", 8080),) and gw.admin_port == 18080
    text = INVENTORY.replace(
        "  port: 8080\n",
        "  port: 8080\n  listen: ['10.0.0.1', '127.0.0.1:9000', '[::1]:9001']\n"
        "  tls: {certificate: {file: gw.crt}, key: {env: GW_TLS_KEY}}\n"
        "  client_limits: {requests_per_second: 5, burst: 10, streams: 4}\n  auth: none\n",
    )
    gw2 = load_inventory_text(text, "inv.yaml").gateway
    assert gw2 is not None and gw2.auth == "none"
    assert gw2.listen_addresses() == (("10.0.0.1", 8080), ("127.0.0.1", 9000), ("::1", 9001))
    assert gw2.tls_certificate is not None and gw2.tls_certificate.ref == "gw.crt"
    assert gw2.tls_key is not None and (gw2.tls_key.kind, gw2.tls_key.ref) == ("env", "GW_TLS_KEY")
    assert (gw2.key_requests_per_second, gw2.key_burst, gw2.key_streams) == (5.0, 10, 4)
