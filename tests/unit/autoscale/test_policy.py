"""The autoscale policy of a template: defaults, every key read, and each mistake at its file:line."""

from __future__ import annotations

import textwrap

import pytest

from clusterctl.errors import InventoryError
from clusterctl.inventory.loader import load_inventory_text
from clusterctl.inventory.model import GpuRef

BASE = """\
version: 1
defaults:
  gpus: {count: 4, model: H100, memory_gib: 80, interconnect: nvlink}
hosts:
  gpu[01-02]:
    address: 10.0.0.[11-12]
  l40s01:
    address: 10.0.0.21
    gpus: {count: 4, model: L40S, memory_gib: 48, interconnect: pcie}
  cpu01:
    address: 10.0.0.31
    gpus: {count: 0}
engines:
  v11: {path: /opt/v/bin/vllm, version: 0.11.0}
models:
  m8: {path: /models/m8}
templates:
  pool:
    model: m8
    engine: v11
    replicas: 2
    tp: 1
    hosts: gpu01,gpu02,l40s01
"""


def load(extra: str):
    return load_inventory_text(BASE + textwrap.indent(textwrap.dedent(extra), "    "), "inv.yaml")


def problems(extra: str) -> list[str]:
    with pytest.raises(InventoryError) as e:
        load(extra)
    return [str(p) for p in e.value.problems]


def test_defaults_and_every_key() -> None:
    p = load("autoscale: {min: 1, max: 4}\n").templates["pool"].autoscale
    assert p is not None
    assert (p.min_replicas, p.max_replicas, p.signal, p.high, p.low) == (1, 4, "load", 0.7, 0.3)
    assert p.scale_in_after_s > p.scale_out_after_s and p.gpus == () and p.hosts is None
    full = (
        load("""\
        autoscale:
          min: 2
          max: 6
          signal: queue
          high: 10
          low: 2
          window_s: 5
          scale_out_after_s: 20
          scale_in_after_s: 300
          cooldown_out_s: 30
          cooldown_in_s: 120
          max_step: 3
          backoff_s: 60
          interval_s: 5
          hosts: gpu01,l40s01
          gpus: ["gpu01:[0-1]", "l40s01:[0-3]"]
          prefer_gpu: H100
          worth: {H100: 1.0, L40S: 0.45}
          gate_timeout_s: 120
          drain_timeout_s: 600
        """)
        .templates["pool"]
        .autoscale
    )
    assert full is not None
    assert (full.signal, full.high, full.low, full.max_step, full.hosts) == ("queue", 10, 2, 3, "gpu01,l40s01")
    assert full.gpus[:2] == (GpuRef("gpu01", 0), GpuRef("gpu01", 1)) and len(full.gpus) == 6
    assert full.worth_of("L40S") == 0.45 and full.worth_of("A100") == 1.0
    assert load("port_base: 8000\n").templates["pool"].autoscale is None  # no policy: not autoscaled


def test_signal_defaults_follow_the_signal() -> None:
    p = load("autoscale: {min: 1, max: 4, signal: ttft_p90}\n").templates["pool"].autoscale
    assert p is not None and (p.high, p.low) == (2.0, 0.5)


@pytest.mark.parametrize(
    "extra, line, words",
    [
        ("autoscale: {max: 4}\n", 24, "missing 'min'"),
        ("autoscale: {min: 3, max: 2}\n", 24, "min (3) is above max (2)"),
        ("autoscale: {min: 3, max: 5}\n", 24, "replicas (2) is outside min..max (3..5)"),
        ("autoscale:\n  min: 1\n  max: 4\n  high: 0.3\n  low: 0.5\n", 28, "low (0.5) must be below high (0.3)"),
        ("autoscale:\n  min: 1\n  max: 4\n  high: 1.5\n", 27, "out of range 0-1 for signal load"),
        ("autoscale:\n  min: 1\n  max: 4\n  signal: gpu_util\n", 27, "'gpu_util' is not one of load, queue"),
        (
            "autoscale:\n  min: 1\n  max: 4\n  scale_in_after_s: 10\n  scale_out_after_s: 60\n",
            27,
            "scale_in_after_s (10) is shorter than scale_out_after_s (60)",
        ),
        ("autoscale:\n  min: 1\n  max: 4\n  hosts: cpu01\n", 27, "cpu01 is not among the template's hosts"),
        ("autoscale:\n  min: 1\n  max: 4\n  gpus: [gpu01:7]\n", 27, "gpu01:7 does not exist"),
        (
            "autoscale:\n  min: 1\n  max: 4\n  prefer_gpu: A100\n",
            27,
            "no host the template may use has GPU model 'A100'",
        ),
        ("autoscale:\n  min: 1\n  max: 4\n  worth: {H200: 2}\n", 27, "no host of the inventory has GPU model 'H200'"),
        ("autoscale:\n  min: 1\n  max: 4\n  worth: {L40S: 0}\n", 27, "must be greater than 0"),
        ("autoscale:\n  min: 1\n  max: 4\n  max_step: 0\n", 27, "max_step: 0 is out of range"),
        (
            "autoscale:\n  min: 1\n  max: 4\n  cooldown_in: 60\n",
            27,
            "unknown key 'cooldown_in'; did you mean 'cooldown_in_s'",
        ),
    ],
)
def test_mistakes_are_named_at_their_line(extra: str, line: int, words: str) -> None:
    got = problems(extra)
    assert any(p.startswith(f"inv.yaml:{line}:") and words in p for p in got), got


def test_the_cli_exits_3_with_the_place(tmp_path) -> None:
    from typer.testing import CliRunner

    from clusterctl.cli.main import app

    inv = tmp_path / "inv.yaml"
    inv.write_text(BASE + "    autoscale: {min: 1, max: 4, low: 0.9}\n")
    res = CliRunner().invoke(app, ["autoscale", "plan", "-i", str(inv), "--state-dir", str(tmp_path / "st")])
    assert res.exit_code == 3
    assert f"{inv}:24" in res.output and "low (0.9) must be below high (0.7)" in res.output


def test_install_writes_a_unit_that_runs_the_daemon(tmp_path) -> None:
    from typer.testing import CliRunner

    from clusterctl.cli.main import app

    inv = tmp_path / "my inv.yaml"
    inv.write_text(BASE + "    autoscale: {min: 1, max: 4}\n")
    res = CliRunner().invoke(
        app,
        [
            "autoscale",
            "install",
            "-i",
            str(inv),
            "--state-dir",
            str(tmp_path / "st"),
            "--unit-dir",
            str(tmp_path / "units"),
            "--no-start",
        ],
    )
    assert res.exit_code == 0, res.output
    unit = (tmp_path / "units" / "clusterctl-autoscale.service").read_text()
    line = next(x for x in unit.splitlines() if x.startswith("ExecStart="))
    assert "autoscale daemon" in line and '"' + str(inv) + '"' in line  # the path with a space stays one word
    assert "Restart=on-failure" in unit and "WantedBy=multi-user.target" in unit
