"""Shell completion of names from the inventory: hosts, @groups, instances, templates.

``clusterctl --install-completion`` (bash, zsh, fish) installs typer's hook; the
functions here are the ``autocompletion=`` of the arguments that take those names.
The inventory is the one the command line names with ``-i`` (when typed before the
word being completed), else ``$CLUSTERCTL_INVENTORY``, the user config, or
``./inventory.yaml``, as for the command itself.  A missing or broken inventory
completes nothing (never an error in the middle of a command line).  In a
comma-separated pattern only the last term is completed (``gpu01,gp<TAB>``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

import typer

if TYPE_CHECKING:
    from clusterctl.inventory.model import Inventory


def _inventory(ctx: typer.Context) -> Optional[Inventory]:
    from clusterctl.config import load_user_config, resolve_inventory_path
    from clusterctl.inventory.loader import load_inventory

    try:
        path = resolve_inventory_path(ctx.params.get("inventory"), load_user_config())
        return load_inventory(path)
    except Exception:  # completion must never fail the shell: a broken inventory completes nothing
        return None


def _terms(incomplete: str) -> tuple[str, str, str]:
    """``(head, sign, last)``: ``gpu01,!gp`` -> ``("gpu01,", "!", "gp")``."""
    head, _, last = incomplete.rpartition(",")
    head = head + "," if head or incomplete.startswith(",") else ""
    sign = "!" if last.startswith("!") else ""
    return head, sign, last[len(sign) :]


def _complete(names: Callable[[Inventory, typer.Context], list[str]]) -> Callable[[typer.Context, str], list[str]]:
    def complete(ctx: typer.Context, incomplete: str) -> list[str]:
        inv = _inventory(ctx)
        if inv is None:
            return []
        head, sign, last = _terms(incomplete)
        return [head + sign + n for n in names(inv, ctx) if n.startswith(last)]

    return complete


def _host_names(inv: Inventory, ctx: typer.Context) -> list[str]:
    return ["all"] + [f"@{g}" for g in inv.groups] + list(inv.hosts)


def _instance_names(inv: Inventory, ctx: typer.Context) -> list[str]:
    names = list(inv.instances)
    try:  # placed template replicas, from the deploy state
        from clusterctl.clusterstate import cluster_dir, cluster_name
        from clusterctl.config import load_user_config_root
        from clusterctl.deploy.placement.deployed import wanted_instances
        from clusterctl.deploy.state import resolve_state_dir

        cfg = load_user_config_root()  # the cluster's state, read without binding (nothing written)
        cfg.state_dir = cluster_dir(cfg.state_dir, cluster_name(inv))
        names = list(wanted_instances(inv, resolve_state_dir(ctx.params.get("state_dir"), cfg)))
    except Exception:
        pass
    templates = [f"{t}-*" for t in getattr(inv, "templates", {}) or {}]
    return sorted(set(names)) + templates


def _template_names(inv: Inventory, ctx: typer.Context) -> list[str]:
    return list(getattr(inv, "templates", {}) or {})


def _targets(inv: Inventory, ctx: typer.Context) -> list[str]:
    return _instance_names(inv, ctx) + _host_names(inv, ctx)


#: ``autocompletion=`` for host patterns, instance patterns, template names, logs targets.
hosts = _complete(_host_names)
instances = _complete(_instance_names)
templates = _complete(_template_names)
targets = _complete(_targets)
