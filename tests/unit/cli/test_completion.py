"""Shell completion of inventory names, through the real entry point as bash calls it
(``_CLUSTERCTL_COMPLETE=complete_bash``, what ``--install-completion`` installs)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

INVENTORY = """\
version: 1
defaults:
  gpus: {count: 2, model: H100-80GB, memory_gib: 80}
groups:
  rack1: {hosts: "gpu[01-02]"}
hosts:
  gpu[01-03]:
    address: 10.0.0.[1-3]
engines:
  vllm: {path: /opt/vllm/bin/vllm, version: 0.11.0}
models:
  qwen:
    path: /models/qwen
    arch: {layers: 64, hidden_size: 5120, attention_heads: 64, kv_heads: 8, head_dim: 128,
           vocab: 151936, params: 32762123264, dtype: bfloat16}
templates:
  chat: {model: qwen, engine: vllm, tp: 1, replicas: 2, hosts: "gpu[01-03]", port_base: 8100}
instances:
  qwen-a: {model: qwen, engine: vllm, placement: "gpu01:[0-1]", port: 8000}
"""


def complete(tmp_path, words: str, inventory: str | None = None) -> list[str]:
    """In this process, through click's completion of the whole app (what the hook runs)."""
    import typer

    from clusterctl.cli.main import build_app

    try:
        from typer._click.shell_completion import ShellComplete
    except ImportError:  # pragma: no cover - older typer uses click itself
        from click.shell_completion import ShellComplete  # type: ignore[no-redef]
    args = words.split()[1:]
    incomplete = "" if words.endswith(" ") else args.pop()
    env = {
        "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "CLUSTERCTL_INVENTORY": inventory or str(tmp_path / "none.yaml"),
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:

        class Completer(ShellComplete):  # get_completions needs none of the shell-specific parts
            source_vars = format_completion = get_completion_args = None  # type: ignore[assignment]

        comp = Completer(typer.main.get_command(build_app()), {}, "clusterctl", "_CLUSTERCTL_COMPLETE")
        return [c.value for c in comp.get_completions(args, incomplete)]
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def complete_in_bash_hook(tmp_path, words: str, inventory: str | None = None) -> list[str]:
    env = dict(
        os.environ,
        _CLUSTERCTL_COMPLETE="complete_bash",
        COMP_WORDS=words,
        COMP_CWORD=str(len(words.split()) - (0 if words.endswith(" ") else 1)),
        XDG_CONFIG_HOME=str(tmp_path / "cfg"),
        XDG_STATE_HOME=str(tmp_path / "state"),
    )
    if inventory:
        env["CLUSTERCTL_INVENTORY"] = inventory
    p = subprocess.run(
        [sys.executable, "-m", "clusterctl.cli.main"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    return p.stdout.split()


@pytest.fixture
def inv(tmp_path):
    p = tmp_path / "site.yaml"
    p.write_text(INVENTORY)
    return str(p)


def test_hosts_groups_instances_templates_and_the_last_term_of_a_pattern(tmp_path, inv):
    assert complete(tmp_path, "clusterctl ping gp", inv) == ["gpu01", "gpu02", "gpu03"]
    assert complete(tmp_path, "clusterctl doctor @", inv) == ["@rack1"]
    assert complete(tmp_path, "clusterctl exec gpu01,!gpu0", inv) == ["gpu01,!gpu01", "gpu01,!gpu02", "gpu01,!gpu03"]
    assert complete(tmp_path, "clusterctl restart q", inv) == ["qwen-a"]
    assert complete(tmp_path, "clusterctl scale c", inv) == ["chat"]
    assert "chat-*" in complete(tmp_path, "clusterctl status ", inv)
    assert set(complete(tmp_path, "clusterctl logs ", inv)) >= {"qwen-a", "@rack1", "gpu03", "all"}


def test_the_inventory_named_on_the_command_line_wins_and_a_broken_one_completes_nothing(tmp_path, inv):
    other = tmp_path / "other.yaml"
    other.write_text(INVENTORY.replace("gpu0", "node0").replace("gpu[", "node["))
    assert complete(tmp_path, f"clusterctl ping -i {other} no", inv) == ["node01", "node02", "node03"]
    assert complete(tmp_path, "clusterctl ping gp", str(tmp_path / "missing.yaml")) == []
    (tmp_path / "bad.yaml").write_text("hosts: [\n")
    assert complete(tmp_path, "clusterctl ping gp", str(tmp_path / "bad.yaml")) == []


def test_the_installed_bash_hook_runs_the_completion(tmp_path, inv):
    assert complete_in_bash_hook(tmp_path, "clusterctl ping gp", inv) == ["gpu01", "gpu02", "gpu03"]
