"""The XDG user config: defaults for options, with file:line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterctl.config import UserConfig, load_user_config, resolve_inventory_path
from clusterctl.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "config.yaml"
    p.write_text(text)
    return p


def test_missing_file_gives_defaults(tmp_path: Path) -> None:
    cfg = load_user_config(tmp_path / "absent.yaml")
    assert cfg.fanout == 64 and cfg.inventory is None


def test_values_are_read(tmp_path: Path) -> None:
    cfg = load_user_config(write(tmp_path, "inventory: /etc/cl/inv.yaml\nfanout: 128\n"))
    assert cfg.inventory == "/etc/cl/inv.yaml" and cfg.fanout == 128


def test_unknown_key_and_bad_type_are_both_reported_with_lines(tmp_path: Path) -> None:
    p = write(tmp_path, "fanout: many\ncolour: red\n")
    with pytest.raises(ConfigError) as e:
        load_user_config(p)
    text = str(e.value)
    assert f"{p}:1: fanout: wrong type str" in text
    assert f"{p}:2: unknown setting 'colour'" in text


def test_yaml_syntax_error_names_the_line(tmp_path: Path) -> None:
    p = write(tmp_path, "fanout: 1\ninventory: [unclosed\n")
    with pytest.raises(ConfigError) as e:
        load_user_config(p)
    assert str(e.value).startswith(f"{p}:")


def test_xdg_config_home_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "clusterctl").mkdir()
    (tmp_path / "clusterctl" / "config.yaml").write_text("fanout: 7\n")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert load_user_config().fanout == 7


def test_inventory_path_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = UserConfig(inventory="from-config.yaml")
    monkeypatch.delenv("CLUSTERCTL_INVENTORY", raising=False)
    assert resolve_inventory_path("cli.yaml", cfg) == "cli.yaml"
    assert resolve_inventory_path(None, cfg) == "from-config.yaml"
    monkeypatch.setenv("CLUSTERCTL_INVENTORY", "env.yaml")
    assert resolve_inventory_path(None, cfg) == "env.yaml"
    assert resolve_inventory_path(None, UserConfig()) == "env.yaml"
    monkeypatch.delenv("CLUSTERCTL_INVENTORY")
    assert resolve_inventory_path(None, UserConfig()) == "inventory.yaml"


def test_state_dir_follows_xdg_state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert UserConfig().state_dir == tmp_path / "clusterctl"


def test_a_scalar_pyyaml_cannot_construct_is_a_problem_not_a_traceback(tmp_path: Path) -> None:
    p = write(tmp_path, "fanout: 0b_\n")
    with pytest.raises(ConfigError) as e:
        load_user_config(p)
    assert f"{p}:1: fanout: cannot read the value" in str(e.value)
