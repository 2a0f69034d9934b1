"""Static checks that keep the package honest: types, and the layer rule.

mypy runs over the whole package (httpx-style: full annotations are part of
the interface); the core must never import the CLI layer or terminal libraries.
"""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "clusterctl"


def test_the_package_type_checks(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path), str(PACKAGE)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


CLI_ONLY = ("typer", "rich", "clusterctl.cli")


def test_core_modules_never_import_the_cli_layer() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if "cli" in path.relative_to(PACKAGE).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [
                f"{path}:{node.lineno}: imports {n}"
                for n in names
                if any(n == m or n.startswith(m + ".") for m in CLI_ONLY)
            ]
    assert not offenders, "\n".join(offenders)


def _imported(tree: ast.Module) -> list[tuple[int, str]]:
    """``(line, module)`` of every absolute import in ``tree``, in functions too."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.lineno, node.module)]
    return out


def test_features_never_import_the_workflow_layer() -> None:
    """``clusterctl/ops/`` (the workflows) may import the features; nothing below it imports ``ops``:
    only the CLI and ``ops`` itself do."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        top = path.relative_to(PACKAGE).parts[0]
        if top in ("cli", "ops"):
            continue
        offenders += [
            f"{path}:{line}: imports {n}"
            for line, n in _imported(ast.parse(path.read_text()))
            if n == "clusterctl.ops" or n.startswith("clusterctl.ops.")
        ]
    assert not offenders, "\n".join(offenders)


def test_the_workflow_layer_exists_and_never_imports_the_cli() -> None:
    """The rule above is only worth something while ``ops`` holds the workflows (doctor's, the report run's)."""
    ops = PACKAGE / "ops"
    assert (ops / "doctor.py").is_file()
    offenders = [
        f"{p}:{line}: imports {n}"
        for p in sorted(ops.rglob("*.py"))
        for line, n in _imported(ast.parse(p.read_text()))
        if any(n == m or n.startswith(m + ".") for m in CLI_ONLY)
    ]
    assert not offenders, "\n".join(offenders)


@functools.lru_cache(maxsize=1)
def _modules() -> list[tuple[Path, str, ast.Module]]:
    """Every module of the package: (path, dotted name, tree)."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        out.append((path, name.removesuffix(".__init__"), ast.parse(path.read_text(), filename=str(path))))
    return out


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def test_no_private_name_is_used_across_modules() -> None:
    """A name starting with ``_`` stays inside its module, and a private module (``cli/_common.py``)
    inside its package: what other modules need is public (no hidden doors between features)."""
    offenders = []
    for path, me, tree in _modules():
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        imported: dict[str, str] = {}  # local name -> the clusterctl module it is bound to
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and node.level == 0
                and node.module.startswith("clusterctl")
            ):
                mod_pkg = node.module.rpartition(".")[0]
                for a in node.names:
                    full = f"{node.module}.{a.name}"
                    imported[a.asname or a.name] = full
                    if _private(a.name) and full.rpartition(".")[0] != package:
                        offenders.append(f"{path}:{node.lineno}: imports the private {full}")
                if any(_private(p) for p in node.module.split(".")) and not (package + ".").startswith(mod_pkg + "."):
                    offenders.append(f"{path}:{node.lineno}: imports the private module {node.module}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("clusterctl") and a.asname:
                        imported[a.asname] = a.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in imported
                and _private(node.attr)
            ):
                offenders.append(f"{path}:{node.lineno}: uses the private {imported[node.value.id]}.{node.attr}")
    assert not offenders, "\n".join(offenders)


def test_the_package_never_writes_the_environment() -> None:
    """Settings travel as arguments: no module sets, updates or deletes ``os.environ`` for another to
    read (the lab, which prepares the environment of the simulated hosts' programs, aside)."""
    offenders = []
    for path, _, tree in _modules():
        if path.relative_to(PACKAGE).parts[0] == "lab":
            continue
        for node in ast.walk(tree):
            env = None
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                env = next(
                    (t for t in targets if isinstance(t, ast.Subscript) and ast.unparse(t.value) == "os.environ"), None
                )
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and ast.unparse(node.func)
                in ("os.environ.update", "os.environ.setdefault", "os.environ.pop", "os.environ.clear", "os.putenv")
            ):
                env = node
            if env is not None:
                offenders.append(f"{path}:{node.lineno}: writes os.environ")
    assert not offenders, "\n".join(offenders)


def test_only_the_cli_reads_the_sudo_password_from_the_environment() -> None:
    """The become (sudo) password is read once, at the CLI's edge (``cli/_hosts.become_password``,
    ``gateway_password``), and passed down as an argument: no module below the CLI names
    ``BECOME_PASSWORD_ENV`` or ``$CLUSTERCTL_BECOME_PASSWORD`` in code (``fleet/factory.py`` defines
    the name)."""
    offenders = []
    for path, _, tree in _modules():
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "cli" or rel.as_posix() == "fleet/factory.py":
            continue
        for node in ast.walk(tree):
            named = (isinstance(node, ast.Name) and node.id == "BECOME_PASSWORD_ENV") or (
                isinstance(node, ast.alias) and node.name == "BECOME_PASSWORD_ENV"
            )
            literal = isinstance(node, ast.Constant) and node.value == "CLUSTERCTL_BECOME_PASSWORD"
            if named or literal:
                offenders.append(f"{path}:{getattr(node, 'lineno', '?')}: reads the sudo password's variable")
    assert not offenders, "\n".join(offenders)


def test_deploy_never_reaches_the_gateway_by_itself() -> None:
    """The gateway's drain hook is given to deploy (``ops/deploy.drain_hook`` builds it): no module
    of ``clusterctl/deploy/`` imports the gateway package, at the top or in a function."""
    offenders = []
    for path, _, tree in _modules():
        if path.relative_to(PACKAGE).parts[0] != "deploy":
            continue
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [f"{path}:{node.lineno}: imports {n}" for n in names if n.startswith("clusterctl.gateway")]
    assert not offenders, "\n".join(offenders)


#: What reaches hosts: the SSH fan-out (the whole package: even ``fleet.shell``'s quoting helpers
#: pull ``fleet/__init__``'s Fleet in; ``shlex`` does the same quoting), the probe's run and the
#: live snapshot.  The analyzers and the bundle reader take facts and texts, never a fleet.
DIAGNOSE_NEVER_IMPORTS = ("clusterctl.fleet", "clusterctl.probe.run", "clusterctl.probe.snapshot")


def _reaches_hosts(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in DIAGNOSE_NEVER_IMPORTS)


def test_the_analyzers_never_reach_the_hosts() -> None:
    """``diagnose/`` is facts in, findings out: gathering a snapshot (``probe/snapshot.py``) and
    running ``doctor --active``'s tests over SSH (``ops/doctor.fleet_runner``) live elsewhere."""
    offenders = [
        f"{path}:{line}: imports {n}"
        for path in sorted((PACKAGE / "diagnose").rglob("*.py"))
        for line, n in _imported_names(ast.parse(path.read_text()))
        if _reaches_hosts(n)
    ]
    assert not offenders, "\n".join(offenders)
    seen = _imported_names(ast.parse("from clusterctl import fleet\nfrom clusterctl.probe import run, factgroups\n"))
    assert [n for _, n in seen if _reaches_hosts(n)] == ["clusterctl.fleet", "clusterctl.probe.run"]
    assert _reaches_hosts("clusterctl.fleet.shell") and not _reaches_hosts("clusterctl.fleetx")


def _imported_names(tree: ast.Module) -> list[tuple[int, str]]:
    """:func:`_imported` plus ``package.name`` for each ``from package import name``."""
    out = _imported(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


#: What acts on hosts or runs a workflow: the CLI reaches it only through clusterctl.ops.
CLI_NEVER_IMPORTS_MODULES = (
    "clusterctl.deploy.rollout.rollback",
    "clusterctl.deploy.rollout.lifecycle",
    "clusterctl.deploy.rollout.drain",
    "clusterctl.deploy.rollout.apply",
    "clusterctl.deploy.playbooks.run",
    "clusterctl.deploy.placement.topology",
    "clusterctl.gateway.hook",
    "clusterctl.gateway.deploy",
    "clusterctl.gateway.sync",
    "clusterctl.gateway.observe",
    "clusterctl.gateway.keys",
    "clusterctl.bench.runner",
    # what reaches hosts or reads/writes the deploy state: status, logs, placement, cordons, scale,
    # facts, exec and ping run in ops/status.py, ops/logs.py, ops/placement.py, ops/facts.py, ops/adhoc.py
    "clusterctl.fleet.ssh",
    "clusterctl.fleet.logs",
    "clusterctl.probe.run",
    "clusterctl.deploy.placement.cordon",
    "clusterctl.deploy.placement.scale",
    "clusterctl.deploy.placement.place",
    "clusterctl.deploy.status.instances",
    "clusterctl.deploy.status.routers",
    "clusterctl.gateway.state",
    # doctor, report, failover, drift, discover, autoscale: their workflows are in ops/ (issue 17)
    "clusterctl.diagnose.doctor",
    "clusterctl.diagnose.baseline",
    "clusterctl.diagnose.acks",
    "clusterctl.diagnose.current",
    "clusterctl.diagnose.thresholds",
    "clusterctl.drift.doctor_checks",
    "clusterctl.drift.run",
    "clusterctl.drift.store",
    "clusterctl.drift.verdict",
    "clusterctl.drift.leak",
    "clusterctl.drift.prompts",
    "clusterctl.drift.client",
    "clusterctl.inventory.discover",
    "clusterctl.report.run",
    "clusterctl.report.history",
    "clusterctl.report.schedule",
    "clusterctl.report.serve",
    "clusterctl.report.filesd",
    "clusterctl.report.active",
    "clusterctl.report.notify",
    "clusterctl.autoscale.run",
    "clusterctl.autoscale.record",
    "clusterctl.gateway.failover",
    "clusterctl.inventory.ansible",  # import-ansible and discover --ansible: ops/inventory.py, ops/discover.py
    "clusterctl.deploy.units.secrets",
    "clusterctl.bench.target",  # bench's TARGET (a URL or an instance, replicas too): ops/bench.endpoint
)
CLI_NEVER_IMPORTS_NAMES = (
    "Deploy",
    "ReleaseDeploy",
    "SurgeDeploy",
    "with_surge",
    "stage_model",
    "node_op",
    "pin_models",
    "make_fleet",
    "Fleet",
    "ParamikoTransport",
    "save_failed",
    "collect_facts",
    "collect_status",
    "StateStore",
    "with_replicas",  # the inventory as deployed (deploy.placement.deployed): read by ops/, not the CLI
)


def test_the_cli_runs_no_deploy_gateway_staging_or_bench_workflow_itself() -> None:
    """``clusterctl/cli/`` parses options and renders: deploy, rollback, playbooks, scale's placement,
    start/stop/restart, the gateway's commands, staging and bench run in ``clusterctl/ops/``
    (``ops/deploy.py``, ``ops/gateway.py``, ``ops/stage.py``, ``ops/bench.py``), and so do status,
    logs, placement show, cordon/uncordon/cordons, scale, facts, exec and ping (``ops/status.py``,
    ``ops/logs.py``, ``ops/placement.py``, ``ops/facts.py``, ``ops/adhoc.py``); the CLI imports
    their requests and results, never the engines that act on hosts, and builds no fleet itself
    (``cli/_hosts.fleets``: a fleet factory handed to the workflow).  Doctor's request (check
    resolution, baseline, acknowledgements), failover's, the report commands, drift, inventory
    discover/diff and autoscale are in ``ops/doctor.py``, ``ops/failover.py``, ``ops/report.py``,
    ``ops/drift.py``, ``ops/discover.py`` and ``ops/autoscale.py``: the CLI imports none of the
    features those workflows drive."""
    offenders = []
    for path, _, tree in _modules():
        if path.relative_to(PACKAGE).parts[0] != "cli":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
                names: list[str] = []
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
                names = [a.name for a in node.names]
            else:
                continue
            offenders += [f"{path}:{node.lineno}: imports {m}" for m in mods if m in CLI_NEVER_IMPORTS_MODULES]
            offenders += [f"{path}:{node.lineno}: imports {n}" for n in names if n in CLI_NEVER_IMPORTS_NAMES]
    assert not offenders, "\n".join(offenders)


def test_the_cli_builds_its_fleet_factories_in_one_place() -> None:
    """Every command's fleets come from ``cli/_hosts.fleets`` (the command's SSH options over the user
    config, the sudo password read once): no other ``cli/`` module imports ``clusterctl.fleet.factory``'s
    builders (``BECOME_PASSWORD_ENV`` and the ``FleetFactory`` type aside)."""
    offenders = []
    for path, _, tree in _modules():
        rel = path.relative_to(PACKAGE).as_posix()
        if not rel.startswith("cli/") or rel == "cli/_hosts.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "clusterctl.fleet.factory":
                built = [a.name for a in node.names if a.name in ("fleet_factory", "make_fleet")]
                if built:
                    offenders.append(f"{path}:{node.lineno}: imports {', '.join(built)} (use cli/_hosts.fleets)")
    assert not offenders, "\n".join(offenders)


def test_fleets_are_built_by_the_one_factory() -> None:
    """``Fleet(...)`` is constructed only in ``fleet/`` (``fleet/factory.py``'s make_fleet): one place
    decides fanout, timeouts, the sudo password and host-key policy from the options and the config."""
    offenders = []
    for path, _, tree in _modules():
        if path.relative_to(PACKAGE).parts[0] == "fleet":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == "Fleet":
                offenders.append(f"{path}:{node.lineno}: builds a Fleet (use clusterctl.fleet.factory)")
    assert not offenders, "\n".join(offenders)


def test_the_tree_passes_ruff() -> None:
    """ruff's rules of pyproject.toml ([tool.ruff]) hold for the package, tests, benchmarks and scripts."""
    root = PACKAGE.parent
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "clusterctl", "tests", "benchmarks", "scripts"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_tree_is_as_ruff_format_writes_it() -> None:
    """Every Python file is formatted by ``ruff format`` ([tool.ruff.format]); the node package as Python 3.8."""
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "."],
        cwd=PACKAGE.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, "run `ruff format` on:\n" + proc.stdout + proc.stderr


#: Imports a node program may make beyond the standard library, each with its reason.
NODE_IMPORT_EXCEPTIONS = {
    # the probe carries its own pynvml (probe/payload.py) and prefers the node's when it is new enough
    ("clusterctl/node/collector.py", "pynvml"),
}


def test_node_programs_import_only_the_stdlib_and_the_node_package() -> None:
    """``clusterctl/node/`` runs on the nodes' own python3: standard library, relative imports
    within the package and ``clusterctl.node`` only (tests/unit/node runs them on Python 3.8)."""
    node_dir = PACKAGE / "node"
    assert (node_dir / "collector.py").is_file()
    offenders = []
    for path in sorted(node_dir.rglob("*.py")):
        rel = str(path.relative_to(PACKAGE.parent))
        for line, n in _imported(ast.parse(path.read_text())):
            top = n.split(".")[0]
            if (
                top in sys.stdlib_module_names
                or n == "clusterctl.node"
                or n.startswith("clusterctl.node.")
                or (rel, n) in NODE_IMPORT_EXCEPTIONS
            ):
                continue
            offenders.append(f"{path}:{line}: imports {n}")
    assert not offenders, "\n".join(offenders)


def test_node_programs_live_in_the_node_package() -> None:
    """Code shipped to the nodes is read through ``clusterctl.node.source``/``path`` only: no module
    elsewhere reads a sibling ``.py`` file to ship it."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] in ("node", "lab"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and re.fullmatch(r"\w+\.py", node.value)
                and node.value != "__init__.py"
            ):
                offenders.append(f"{path}:{node.lineno}: names the program file {node.value!r}")
    assert not offenders, "\n".join(offenders)


def test_one_class_per_name_for_the_shared_vocabulary() -> None:
    """``Problem`` (a located configuration problem, ``errors.py``) and ``Finding`` are defined once:
    other kinds of problem carry their own name (``PreflightProblem``, ``NicProblem``)."""
    where: dict[str, list[str]] = {"Problem": [], "Finding": []}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name in where:
                where[node.name].append(str(path.relative_to(PACKAGE.parent)))
    assert where == {"Problem": ["clusterctl/errors.py"], "Finding": ["clusterctl/diagnose/findings.py"]}, where


# In-function imports (docs/architecture.md, "What holds").  The CLI may import inside its command
# functions: main.py registers every command module at start-up, and a command loads the features it
# runs only when it runs (start-up cost, measured in benchmarks/).  Everywhere else an import sits at
# the top of its module unless it is listed here with its reason (the last LATER entries, imports
# with no cycle that had not been moved yet, went in issue 17; tests/unit/test_import_order.py
# imports every module first in a fresh process, so a move that makes a cycle fails there).
CYCLE = "import cycle: the imported module imports this one (directly or through its package)"
OPTIONAL = "a third-party module only this path needs (absent where the path is not used)"
SLOW = "slow to load (paramiko, PyYAML, importlib.metadata) and needed on one path only"
NODE = "node-side program: a standard module only one of its jobs needs"

INLINE_IMPORTS: dict[str, str] = {
    "deploy/status/instances.py clusterctl.diagnose.bundle": SLOW,  # start-up: --help reaches the importing module (ops.gateway -> gateway.render)
    "deploy/status/instances.py clusterctl.probe.snapshot": SLOW,  # start-up: as the bundle above (the probe payload, the fleet)
    "deploy/status/instances.py clusterctl.diagnose.tp": SLOW,  # start-up: --help reaches the importing module (ops.gateway -> gateway.render)
    "deploy/units/render.py clusterctl.deploy.units.sdversion": SLOW,  # start-up: --help reaches the importing module (ops.gateway -> gateway.render)
    "diagnose/serving.py clusterctl.diagnose.tp": SLOW,  # start-up: --help reaches the importing module (ops.gateway -> gateway.render)
    "stage/plan.py clusterctl.node.stage.relay": SLOW,  # start-up: --help reaches the importing module (ops.gateway -> gateway.render)
    "bench/tokens.py tokenizers": OPTIONAL,
    "deploy/rollout/engine.py clusterctl.deploy.rollout.rollback": CYCLE,
    "deploy/units/secrets.py yaml": SLOW,
    "deploy/units/render.py clusterctl.deploy.units.pd": CYCLE,
    "diagnose/registry.py clusterctl.diagnose.analyzers": CYCLE,
    "fleet/factory.py clusterctl.fleet.ssh": SLOW,
    "fleet/fleet.py clusterctl.fleet.ssh": CYCLE,
    "fleet/transport.py clusterctl.fleet.ssh": CYCLE,
    "gateway/render.py clusterctl.gateway.vrrp": CYCLE,
    "inventory/sshconfig.py paramiko": OPTIONAL,
    "lab/realvllm.py clusterctl.lab.realmodel": CYCLE,
    "lab/vllm_sim/cli.py clusterctl.lab.vllm_sim.serve": SLOW,  # the simulator's vllm --version / make-model: 20 ms of imports, 75 with serve's 16 modules (bytecode cached)
    "lab/tinyllama_gen.py tokenizers": OPTIONAL,
    "lab/tinyllama_gen.py torch": OPTIONAL,
    "lab/tinyllama_gen.py transformers": OPTIONAL,
    "node/bundle.py http.client": NODE,
    "node/collector.py ctypes": NODE,
    "node/collector.py importlib": NODE,
    "node/collector.py pynvml": OPTIONAL,
    "node/collector.py resource": NODE,
    "node/deploy.py pwd": NODE,
    "node/stage/fetch.py base64": NODE,
    "node/stage/fetch.py http.client": NODE,
    "node/stage/fetch.py random": NODE,
    "node/stage/fetch.py urllib.parse": NODE,
    "node/stage/layout.py shutil": NODE,
    "node/stage/main.py clusterctl.node.stage.pagecache": NODE,
    "node/stage/main.py clusterctl.node.stage.s3": NODE,
    "node/stage/main.py subprocess": NODE,
    "probe/payload.py importlib": SLOW,
    "probe/payload.py pynvml": OPTIONAL,
    "report/run.py clusterctl.report.html": CYCLE,  # report/html.py imports report.run (host_summary)
}


def _in_functions(tree: ast.AST, inside: bool = False) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of ``tree`` that sit inside a function (at any depth)."""
    out: list[ast.Import | ast.ImportFrom] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out += [node] if inside else []
        else:
            out += _in_functions(node, inside or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return out


def _is_module(dotted: str) -> bool:
    rel = Path(*dotted.split(".")[1:])
    return dotted.startswith("clusterctl.") and (
        (PACKAGE / rel).with_suffix(".py").is_file() or (PACKAGE / rel / "__init__.py").is_file()
    )


@functools.lru_cache(maxsize=1)
def _inline_imports() -> list[tuple[str, int, str]]:
    """``(path under clusterctl/, line, "path module")`` of every import inside a function; ``module``
    is the one imported (``from clusterctl.lab import light``: ``clusterctl.lab.light``)."""
    out: dict[tuple[str, str], int] = {}
    for path, me, tree in _modules():
        rel = str(path.relative_to(PACKAGE))
        package = me if path.name == "__init__.py" else me.rpartition(".")[0]
        for node in _in_functions(tree):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
                sub = f"{base}.{node.names[0].name}"
                mods = [sub if _is_module(sub) else base]
            for m in mods:
                out.setdefault((rel, m), node.lineno)
    return [(rel, line, f"{rel} {m}") for (rel, m), line in sorted(out.items())]


def test_in_function_imports_are_listed_with_their_reason() -> None:
    """Outside the CLI, an import inside a function is one of INLINE_IMPORTS (with its reason)."""
    unlisted = [
        f"clusterctl/{rel}:{line}: {key.split()[1]}"
        for rel, line, key in _inline_imports()
        if not rel.startswith("cli/") and key not in INLINE_IMPORTS
    ]
    assert not unlisted, (
        "import these at the top of their modules, or list them in INLINE_IMPORTS with "
        "the reason they cannot be:\n" + "\n".join(unlisted)
    )


def test_every_listed_in_function_import_still_exists() -> None:
    """INLINE_IMPORTS holds only imports that are still inside a function: an entry whose import
    moved to the top of its module (or whose module moved) is removed, so the list shrinks."""
    found = {key for _, _, key in _inline_imports()}
    stale = sorted(key for key in INLINE_IMPORTS if key not in found)
    assert not stale, "no longer inside a function (remove from INLINE_IMPORTS):\n" + "\n".join(stale)


def test_the_in_function_import_check_sees_what_it_lists() -> None:
    """The check reads the imports it is meant to: the CLI's command functions (exempt) are found,
    and every listed reason is one of the kinds above."""
    assert set(INLINE_IMPORTS.values()) <= {CYCLE, OPTIONAL, SLOW, NODE}
    assert not any(key.startswith("cli/") for key in INLINE_IMPORTS)
    assert sum(rel.startswith("cli/") for rel, _, _ in _inline_imports()) > 50


# -- facts are read through the typed fact groups ---------------------------------------------------

#: The facts document's top-level sections (docs/facts.md).
FACT_SECTIONS = frozenset(
    {"gpus", "nics", "units", "kernel_log", "host", "rdma_prereqs", "tools", "node_prereqs", "errors"}
    | {"collected_at", "schema"}
)
#: The readers of facts: analyzers, bring-up, failover, discover, pre-flight, placement's reader.
FACT_READERS = ("diagnose/", "bringup/", "gateway/failover.py", "inventory/discover.py", "deploy/preflight/")
#: Modules that write facts documents (from nvidia-smi or an operator's raw outputs), not read them.
FACT_WRITERS = ("diagnose/evidence.py", "diagnose/nvsmi.py")
#: Section-named keys on something that is not a facts document, with why.
FACT_KEYS_ALLOWED: dict[str, str] = {}  # none since the node bundle's reader moved to probe/snapshot.py
_FACTS_NAME = re.compile(r"\b(facts|doc|raw)\b")


def _raw_fact_reads(rel: str, source: str) -> list[tuple[int, str]]:
    """``facts["gpus"]`` / ``doc.get("nics")`` style reads: a section-named key on an expression
    named like a facts document (``facts``, ``doc``, ``.raw``)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        base: ast.expr | None = None
        key: object = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            base, key = node.value, node.slice.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            base, key = node.func.value, node.args[0].value
        if base is not None and key in FACT_SECTIONS and _FACTS_NAME.search(ast.unparse(base)):
            out.append((node.lineno, ast.unparse(node)))
    return out


def test_fact_readers_read_the_typed_groups_not_the_raw_document() -> None:
    """Analyzers, bring-up, failover, discover and pre-flight read a host's facts through
    ``probe/factgroups.py`` (or ``probe.facts.Facts``, made of the groups): the JSON is parsed,
    leniently and against the collector's schema, in one place."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if not rel.startswith(FACT_READERS) or rel in FACT_WRITERS:
            continue
        for line, src in _raw_fact_reads(rel, path.read_text()):
            if f"{rel} {src}" not in FACT_KEYS_ALLOWED:
                found.append(f"clusterctl/{rel}:{line}: {src}")
    assert not found, "read these through a fact group (clusterctl/probe/factgroups.py):\n" + "\n".join(found)


def test_the_raw_fact_read_check_sees_what_it_forbids() -> None:
    """The check finds each style it forbids, and nothing on other names or keys."""
    src = 'facts["gpus"]\ndoc.get("nics")\nr.facts.raw.get("kernel_log")\nfacts[h]["units"]\nread["units"]\ndoc.get("x")\n'
    assert [line for line, _ in _raw_fact_reads("x.py", src)] == [1, 2, 3, 4]
    for key in FACT_KEYS_ALLOWED:
        rel, src = key.split(" ", 1)
        assert (PACKAGE / rel).is_file() and src in {s for _, s in _raw_fact_reads(rel, (PACKAGE / rel).read_text())}
