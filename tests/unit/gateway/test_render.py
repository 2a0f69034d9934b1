"""Rendering the gateway: golden files, nginx -t on the result, secrets, states."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from clusterctl.gateway.render import GatewayPaths, GatewayRenderError, ServerState, render_gateway
from clusterctl.inventory.model import GpuRef, Inventory

GOLDEN = Path(__file__).parent / "golden"
STATES = {"q2": ServerState(down=True, reason="draining"), "q1": ServerState(weight=40)}


def _by_name(files: tuple) -> dict[str, str]:
    return {Path(f.path).name: f.text for f in files if not f.remove}


def test_golden_files(inv: Inventory) -> None:
    """The whole rendered config, reviewed once; UPDATE_GOLDEN=1 rewrites it."""
    rendered = _by_name(render_gateway(inv, inv.instances, STATES, api_key=None).files)
    assert set(rendered) == {"nginx.conf", "gateway.conf", "gateway.js", "upstream-auth.conf", "clients.json"}
    for name, text in rendered.items():
        golden = GOLDEN / name
        if os.environ.get("UPDATE_GOLDEN"):
            golden.write_text(text)
        assert text == golden.read_text(), f"{name} differs from {golden}"


def test_sticky_upstream_has_no_weights_and_least_conn_has_them(inv: Inventory) -> None:
    conf = _by_name(render_gateway(inv, inv.instances, STATES).files)["gateway.conf"]
    sticky = conf[conf.index("upstream m_qwen_s {") : conf.index("upstream m_qwen_l {")]
    lc = conf[conf.index("upstream m_qwen_l {") : conf.index("# qwen-v2")]
    assert "hash $http_x_session_id consistent;" in sticky and "weight=" not in sticky
    assert "least_conn;" in lc and "weight=40" in lc
    assert "server 10.0.1.2:8001 max_conns=4 down;  # q2 (draining)" in sticky
    assert "max_conns=4 weight=100 down;  # q2" in lc
    assert "proxy_next_upstream error timeout;\n" in conf and "non_idempotent;" not in conf


def test_secret_only_in_auth_file_and_redacted(inv: Inventory) -> None:
    r = render_gateway(inv, inv.instances, api_key="sk-live-123")
    secret = [f for f in r.files if "sk-live-123" in f.text]
    assert [(Path(f.path).name, oct(f.mode), f.group) for f in secret] == [("upstream-auth.conf", "0o640", "www-data")]
    assert not any("sk-live-123" in f.text for f in r.redacted())
    assert "sk-live-123" not in repr(r)
    # a new key is a new config (nginx must reload), though the digest never shows it
    assert r.digest != render_gateway(inv, inv.instances, api_key="sk-live-456").digest


@pytest.mark.parametrize("key", ['a"b', "a b", "a$b", "a;b", ""])
def test_key_nginx_would_interpret_is_refused_without_echo(inv: Inventory, key: str) -> None:
    with pytest.raises(GatewayRenderError) as e:
        render_gateway(inv, inv.instances, api_key=key)
    assert key not in str(e.value) or not key


def test_same_input_same_digest_and_state_changes_digest(inv: Inventory) -> None:
    a = render_gateway(inv, inv.instances, STATES)
    assert a.digest == render_gateway(inv, inv.instances, dict(STATES)).digest
    assert a.digest != render_gateway(inv, inv.instances, {"q2": ServerState(down=False)}).digest
    health = _by_name(a.files)["gateway.conf"]
    assert f'"config":"{a.config}"' in health


def test_routes_gray_canary_without_instances_falls_back_to_stable(inv: Inventory) -> None:
    only_v1 = {k: v for k, v in inv.instances.items() if k != "q3"}
    js = _by_name(render_gateway(inv, only_v1).files)["gateway.js"]
    assert '"canary": null' in js and '"upstream": "m_qwen"' in js
    conf = _by_name(render_gateway(inv, only_v1).files)["gateway.conf"]
    assert "mirror /_gw_mirror" not in conf  # the mirror candidate has no instance


def test_without_api_key_the_auth_file_is_removed_and_not_included(inv: Inventory) -> None:
    assert inv.gateway is not None
    inv.gateway.api_key = None
    r = render_gateway(inv, inv.instances)
    auth = [f for f in r.files if f.path.endswith("upstream-auth.conf")]
    assert [f.remove for f in auth] == [True]
    assert "upstream-auth.conf" not in _by_name(r.files)["gateway.conf"]


def test_no_gateway_section_is_an_error(inv: Inventory) -> None:
    inv.gateway = None
    with pytest.raises(GatewayRenderError, match="no 'gateway:' section"):
        render_gateway(inv, inv.instances)


@pytest.mark.skipif(
    shutil.which("nginx") is None or not Path("/usr/share/nginx/modules/ngx_http_js_module.so").exists(),
    reason="nginx with njs (libnginx-mod-http-js) not installed; scripts/install-deps installs it",
)
def test_nginx_accepts_the_rendered_config(inv: Inventory, tmp_path: Path) -> None:
    paths = GatewayPaths(
        conf_dir=str(tmp_path / "clusterctl"),
        nginx_conf=str(tmp_path / "nginx.conf"),
        pid_file=str(tmp_path / "nginx.pid"),
        log_dir=str(tmp_path),
        modules_include="/etc/nginx/modules-enabled/*.conf",
    )
    (tmp_path / "clusterctl").mkdir()
    for f in render_gateway(inv, inv.instances, STATES, api_key="sk-test", paths=paths).files:
        Path(f.path).write_text(f.text)
    # -p: Debian's modules-enabled files name the module relative to nginx's prefix
    p = subprocess.run(
        ["nginx", "-t", "-p", "/usr/share/nginx/", "-c", paths.nginx_conf], capture_output=True, text=True, timeout=30
    )
    assert p.returncode == 0, p.stderr


def test_listen_addresses_admin_server_and_upstream_keepalive(inv: Inventory) -> None:
    from dataclasses import replace as dc_replace

    assert inv.gateway is not None
    inv.gateway = dc_replace(inv.gateway, listen=(("10.0.0.1", 8080), ("::1", 9001)))
    conf = _by_name(render_gateway(inv, inv.instances).files)["gateway.conf"]
    assert "    listen 10.0.0.1:8080;\n    listen [::1]:9001;\n" in conf and "listen 8080;" not in conf
    assert "listen 127.0.0.1:18080;" in conf  # the loopback admin server: health for deploy and keepalived
    # below vLLM's 5 s keep-alive: nginx closes idle connections first
    assert conf.count("keepalive_timeout 4s;") == conf.count("keepalive 32;") + conf.count("keepalive 8;") > 0


def test_mirror_location_repeats_every_inherited_header(inv: Inventory) -> None:
    conf = _by_name(render_gateway(inv, inv.instances).files)["gateway.conf"]
    mirror = conf[conf.index("location = /_gw_mirror/") :]
    mirror = mirror[: mirror.index("}\n    }") if "}\n    }" in mirror else mirror.index("\n    }")]
    for line in (
        'proxy_set_header Connection "";',
        "proxy_set_header Host $host;",
        "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;",
        "upstream-auth.conf;",
        "proxy_set_header X-Gateway-Mirror 1;",
    ):
        assert line in mirror, line


def test_least_score_one_upstream_per_instance_with_the_others_as_backups(inv: Inventory) -> None:
    assert inv.gateway is not None and inv.gateway.dispatch == "least_score"  # the default
    r = render_gateway(inv, inv.instances, STATES)
    conf, js = _by_name(r.files)["gateway.conf"], _by_name(r.files)["gateway.js"]
    q1 = conf[conf.index("upstream m_qwen_i0 {") :]
    q1 = q1[: q1.index("}")]
    assert "server 10.0.1.1:8001 max_conns=4 max_fails=1 fail_timeout=10s;" in q1  # q1 itself
    assert "server 10.0.1.2:8001 max_conns=4 max_fails=1 fail_timeout=10s backup down;" in q1  # q2, draining
    # a lost host: nginx moves the request after a 1 s connect, before a client gives up; only connects
    assert "proxy_connect_timeout 1s;" in conf and "proxy_next_upstream error timeout;\n" in conf
    assert "location @m_qwen_i0 {" in conf and "proxy_pass http://m_qwen_i0;" in conf
    assert 'var DISPATCH = "least_score";' in js
    assert '"loc": "m_qwen_i1"' in js and '"down": true' in js  # the drain's mark-down reaches njs too
    assert "location = /gateway/scores {" in conf
    assert r.runtime == {"state_dir": "/var/lib/clusterctl-gateway", "token": "/etc/nginx/clusterctl/admin.token"}


def test_least_score_backups_on_other_hosts_first_each_instance_its_own_neighbour(inv: Inventory) -> None:
    """A lost host takes every instance on it: an instance's first backup is on another host, and
    the instances of one host do not all fall back on the same one."""
    assert inv.gateway is not None
    more = {
        f"x{i}": replace(inv.instances["q1"], name=f"x{i}", placement=(GpuRef(h, g),), port=8001 + i)
        for i, (h, g) in enumerate([("gpu01", 4), ("gpu01", 5), ("gpu02", 4), ("gpu02", 5)])
    }
    instances = {n: i for n, i in inv.instances.items() if n != "q2"} | more
    conf = _by_name(render_gateway(inv, instances, {}).files)["gateway.conf"]
    firsts = []
    for i in range(5):  # q1 x0 x1 on gpu01, x2 x3 on gpu02
        up = conf[conf.index(f"upstream m_qwen_i{i} {{") :]
        servers = [ln.split()[1] for ln in up[: up.index("}")].splitlines() if ln.strip().startswith("server ")]
        own = servers[0].rsplit(":", 1)[0]
        hosts = [a.rsplit(":", 1)[0] for a in servers[1:]]
        assert hosts[0] != own and hosts == sorted(hosts, key=lambda h: h == own), servers
        firsts.append(servers[1])
    assert len(set(firsts[:3])) > 1, firsts  # gpu01's three instances spread over gpu02's


def test_least_conn_and_round_robin_stay_selectable(inv: Inventory) -> None:
    assert inv.gateway is not None
    for dispatch, line in (("least_conn", "    least_conn;\n"), ("round_robin", None)):
        inv.gateway.dispatch = dispatch
        files = _by_name(render_gateway(inv, inv.instances, STATES).files)
        lc = files["gateway.conf"][files["gateway.conf"].index("upstream m_qwen_l {") :]
        lc = lc[: lc.index("}")]
        assert f'var DISPATCH = "{dispatch}";' in files["gateway.js"]
        assert "weight=40" in lc and ((line in lc) if line else ("least_conn" not in lc)), lc


def test_least_score_seats_are_in_the_config_before_any_sync(inv: Inventory) -> None:
    """njs knows each instance's seats (1 / --max-num-seqs of the inventory; 256 when unset) from the
    rendered router table: before sync's first post (a fresh deploy, a slow sync) a seat count of its
    own would send a fifth request to a 4-seat instance while another had a free seat."""
    import json as _json

    assert inv.gateway is not None
    inv.instances["q1"] = replace(inv.instances["q1"], args={**inv.instances["q1"].args, "max-num-seqs": 4})
    js = _by_name(render_gateway(inv, inv.instances, STATES).files)["gateway.js"]
    members = _json.loads(
        js[js.index("var MEMBERS = ") + len("var MEMBERS = ") : js.index(";", js.index("var MEMBERS"))]
    )
    steps = {m["name"]: m["step"] for ms in members.values() for m in ms}
    assert steps["q1"] == 0.25 and steps["q2"] == round(1 / 256, 6), steps
    assert "m.step > 0 ? m.step" in js
