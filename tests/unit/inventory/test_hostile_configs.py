"""ssh_config and Ansible inputs that used to hang, exhaust memory, traceback or run commands (issue 21).

Each case runs the real CLI in a capped child (tests/support/fuzz.py): a
regression is a counted hang or MemoryError here, not a stuck test run.
"""

from __future__ import annotations

import os
from pathlib import Path

from support import fuzz

CAPS = {"mem_mib": 1024, "case_s": 15.0}


def _run(tmp_path: Path, cases: list[fuzz.Case]) -> list[dict]:
    t = fuzz.run_cases("hostile", cases, tmp_path, **CAPS)
    assert (t.tracebacks, t.hangs, t.memory) == (0, 0, 0), t.failures
    return t.results


def _validate(tmp_path: Path, config: str, env: dict[str, str] | None = None) -> fuzz.Case:
    inv = tmp_path / "inv.yaml"
    inv.write_text("version: 1\nhosts: {gpu01: {}}\n")
    cfg = tmp_path / f"config-{abs(hash(config))}"
    cfg.write_text(config)
    return fuzz.Case(["inventory", "validate", "-i", str(inv)], {"CLUSTERCTL_SSH_CONFIG": str(cfg), **(env or {})})


def test_includes_of_a_fifo_dev_zero_a_binary_and_itself_are_warnings(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    os.symlink("/dev/zero", tmp_path / "zero")
    (tmp_path / "binary").write_bytes(b"\x7fELF\0\0" * 1000)
    (tmp_path / "self").write_text(f"Include {tmp_path}/self\n")
    results = _run(
        tmp_path,
        [
            _validate(tmp_path, f"Include {tmp_path}/{name}\nHost *\n  User ops\n")
            for name in ("fifo", "zero", "binary", "self")
        ],
    )
    fifo, zero, binary, self_ = (r["err"] for r in results)
    assert all(r["rc"] == 0 for r in results)  # warnings, not errors: the inventory is fine
    assert "not a regular file" in fifo and "not a regular file" in zero
    assert "a binary file" in binary and "includes itself" in self_


def test_include_star_in_three_files_is_bounded(tmp_path: Path) -> None:
    ssh = tmp_path / "home" / ".ssh"
    ssh.mkdir(parents=True)
    for k in range(3):
        (ssh / f"c{k}").write_text("Include *\nHost *\n  User star\n")
    [r] = _run(tmp_path, [_validate(tmp_path, "Include *\n")])
    assert r["rc"] == 0 and r["s"] < 10


def test_match_exec_is_skipped_with_a_warning_unless_allowed(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    config = f'Match exec "touch {marker}"\n  User fromexec\n'
    refused, allowed = _run(
        tmp_path, [_validate(tmp_path, config), _validate(tmp_path, config, {"CLUSTERCTL_SSH_MATCH_EXEC": "1"})]
    )
    assert "would run a command; its block is skipped" in refused["err"]
    assert marker.exists()  # only the second case, which asked for it, ran the command
    marker.unlink()
    _run(tmp_path, [_validate(tmp_path, config)])
    assert not marker.exists()


def test_ansible_ranges_are_counted_before_they_are_expanded(tmp_path: Path) -> None:
    cases = []
    for i, text in enumerate(
        ["[web]\nweb[01:99999999]\n", "[web]\nh[a:z][a:z][a:z][a:z][a:z]\n", "all:\n  hosts:\n    web[01:99999999]:\n"]
    ):
        p = tmp_path / f"a{i}.{'yml' if text.startswith('all') else 'ini'}"
        p.write_text(text)
        cases.append(fuzz.Case(["inventory", "import-ansible", str(p)]))
    for r in _run(tmp_path, cases):
        assert r["rc"] == 3 and "more than 100000 names" in r["err"] and r["s"] < 10, r


def _alias_bomb(indent: str) -> str:
    lines = [f"{indent}x0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"]
    lines += [f"{indent}x{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]\n" for i in range(1, 10)]
    return "".join(lines)


def test_an_ansible_yaml_alias_bomb_is_refused(tmp_path: Path) -> None:
    """A billion laughs in YAML Ansible (9^10 values once expanded) hung the import; group_vars too."""
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  vars:\n" + _alias_bomb("    ") + "  hosts:\n    web01:\n      bomb: *a9\n")
    (tmp_path / "group_vars").mkdir()
    plain = tmp_path / "plain.yml"
    plain.write_text("all:\n  hosts:\n    web01:\n")
    (tmp_path / "group_vars" / "all.yml").write_text(_alias_bomb("") + "bomb: *a9\n")
    for r in _run(tmp_path, [fuzz.Case(["inventory", "import-ansible", str(p)]) for p in (inv, plain)]):
        assert r["rc"] == 3 and "alias bomb" in r["err"], r


def test_deep_flow_nesting_is_refused_before_the_slow_parser_sees_it(tmp_path: Path) -> None:
    """Found by the fuzz campaign: PyYAML's pure-Python parser (used again for its message after libyaml
    refuses a file) spends seconds of CPU on a few thousand ``[``; 100 levels is the limit now."""
    inv = tmp_path / "inv.yaml"
    inv.write_text("version: 1\nhosts:\n  h: " + "[" * 20000 + "\n")
    ok = tmp_path / "ok.yaml"
    ok.write_text('version: 1\nhosts:\n  h: {labels: {a: "[[[[' + "[" * 200 + '"}}\n')  # quoted: not nesting
    deep, quoted = _run(tmp_path, [fuzz.Case(["inventory", "validate", "-i", str(p)]) for p in (inv, ok)])
    assert deep["rc"] == 3 and "inv.yaml:3: YAML nesting is too deep" in deep["out"] + deep["err"], deep
    assert quoted["rc"] == 0, quoted
