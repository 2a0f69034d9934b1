"""Where the check data comes from: shipped files, a site directory overriding some of
them, and refusal of a missing or empty catalogue (never a doctor with no thresholds)."""

from __future__ import annotations

import pytest

from clusterctl.diagnose import thresholds as T
from clusterctl.errors import ConfigError


@pytest.fixture(autouse=True)
def no_site(monkeypatch, tmp_path):
    monkeypatch.delenv(T.ENV_DIR, raising=False)
    monkeypatch.setattr(T, "SITE_DIR", tmp_path / "no-etc")


def test_the_shipped_files_load_from_the_source_tree():
    assert T.shipped_dir() == T.SOURCE_DIR
    data = T.load_thresholds()
    assert data["xid"]["codes"][79]["severity"] == "CRIT" and "pfc" in data["roce"]


def test_a_site_directory_replaces_only_the_files_it_has(monkeypatch, tmp_path):
    site = tmp_path / "etc-checks"
    (site / "drift").mkdir(parents=True)
    (site / "gpu.yaml").write_text("gpu:\n  temperature_warn_c: 70\n")
    (site / "drift" / "basic.jsonl").write_text('{"prompt": "x"}\n')
    monkeypatch.setattr(T, "SITE_DIR", site)
    data = T.load_thresholds()
    assert data["gpu"] == {"gpu": {"temperature_warn_c": 70}}
    assert data["xid"]["codes"][79]["severity"] == "CRIT"  # not overridden: shipped
    assert T.check_file("drift/basic.jsonl") == site / "drift" / "basic.jsonl"
    assert T.check_file("drift.yaml") == T.SOURCE_DIR / "drift.yaml"
    # the environment variable wins over /etc/clusterctl/checks
    other = tmp_path / "env-checks"
    other.mkdir()
    monkeypatch.setenv(T.ENV_DIR, str(other))
    assert T.load_thresholds()["gpu"]["gpu"]["temperature_warn_c"] == 85


def test_a_missing_or_empty_catalogue_is_an_error_naming_the_file(tmp_path):
    (tmp_path / "gpu.yaml").write_text("gpu:\n  temperature_warn_c: 85\n")
    (tmp_path / "roce.yaml").write_text("")
    with pytest.raises(ConfigError) as e:
        T.load_thresholds(tmp_path)
    text = str(e.value)
    assert f"{tmp_path / 'xid.yaml'}: missing" in text and f"{tmp_path / 'roce.yaml'}:1: empty" in text
    (tmp_path / "xid.yaml").write_text("codes:\n")
    with pytest.raises(ConfigError, match=r"xid.yaml:1: empty: 'codes'"):
        T.load_thresholds(tmp_path)
    with pytest.raises(ConfigError, match="missing"):
        T.load_thresholds(tmp_path / "absent")


def test_an_environment_variable_naming_no_directory_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv(T.ENV_DIR, str(tmp_path / "typo"))
    with pytest.raises(ConfigError, match="does not exist"):
        T.load_thresholds()


def test_no_shipped_data_at_all_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setattr(T, "PACKAGED_DIR", tmp_path / "pkg" / "_checks")
    monkeypatch.setattr(T, "SOURCE_DIR", tmp_path / "checks")
    with pytest.raises(ConfigError, match="shipped check data is missing"):
        T.load_thresholds()
