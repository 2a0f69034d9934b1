"""The ``clusterctl`` command: one typer app, one module per command group.

This is the only package that imports typer and rich.  ``main()`` turns usage
errors into exit code 3 (UNKNOWN) rather than click's 2, which monitoring
systems would read as CRITICAL (see ``clusterctl.exitcodes``).

It is also the safety net: an exception no command expected (a bug, or an
input nothing anticipated) is one line on stderr and exit 3, never a
traceback with exit 1 that a monitoring check would read as WARN.
``--debug`` (anywhere before ``--``) or ``CLUSTERCTL_DEBUG=1`` prints the
traceback as well.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

import typer

from typer import Abort, Exit

try:  # typer >= 0.29 vendors its own copy of click
    from typer._click.exceptions import ClickException, NoArgsIsHelpError
except ImportError:  # pragma: no cover - older typer uses click itself
    from click.exceptions import ClickException, NoArgsIsHelpError  # type: ignore[no-redef,assignment]

from clusterctl import __version__
from clusterctl.config import bind_state_dir
from clusterctl.errors import ClusterctlError
from clusterctl.exitcodes import INTERRUPTED, USAGE_ERROR

#: Command modules in ``--help`` order: each adds its commands with ``register(app)``
#: or is a group ``app`` added under its name.
_MODULES = (
    "inventory",
    "fleet",
    "facts",
    "doctor",
    "collect",
    "stage",
    "deploy",
    "instances",
    "placement",
    "gateway",
    "failover",
    "autoscale",
    "bench",
    "drift",
    "net",
    "node",
    "engine",
    "lab",
    "report",
    "logs",
    "planned",
)
_GROUPS = {"inventory", "lab", "report", "drift", "gateway", "net", "node", "engine"}
#: The module that owns each top-level command; a command not named here (the
#: planned ones) is found by registering everything.
_OWNER = {
    "inventory": "inventory",
    "exec": "fleet",
    "ping": "fleet",
    "facts": "facts",
    "lab": "lab",
    "doctor": "doctor",
    "doctor-ack": "doctor",
    "collect": "collect",
    "stage": "stage",
    "deploy": "deploy",
    "rollback": "deploy",
    "report": "report",
    "bench": "bench",
    "drift": "drift",
    "gateway": "gateway",
    "status": "instances",
    "start": "instances",
    "stop": "instances",
    "restart": "instances",
    "cordon": "placement",
    "uncordon": "placement",
    "cordons": "placement",
    "scale": "placement",
    "placement": "placement",
    "failover": "failover",
    "autoscale": "autoscale",
    "logs": "logs",
    "net": "net",
    "node": "node",
    "engine": "engine",
}


def _version(value: bool) -> None:
    if value:
        print(f"clusterctl {__version__}")
        raise typer.Exit(0)


def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    debug: bool = typer.Option(False, "--debug", help="On an unexpected error, print its traceback (any position)."),
) -> None:
    """Bring up and diagnose bare-metal vLLM inference clusters over SSH."""


def build_app(command: str | None = None) -> typer.Typer:
    """The typer app with every command, or only the module that owns ``command``.

    Importing a command module pulls in what it needs (paramiko, the probe,
    the lab), so ``clusterctl exec`` imports neither the lab nor the probe;
    ``--help`` and unknown names get every command.
    """
    app = typer.Typer(
        name="clusterctl",
        help="Bring up and diagnose bare-metal vLLM inference clusters over SSH.\n\n"
        "One inventory file describes hosts, GPUs, NICs, models and instances; "
        "every command reads it.\n\n"
        "Examples:\n\n  clusterctl inventory validate -i inventories/example-16xh100-roce.yaml\n\n"
        "  clusterctl ping all -i /var/lib/clusterctl-lab/inventory.yaml",
        no_args_is_help=True,
        context_settings={"help_option_names": ["-h", "--help"]},
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
    )
    app.callback()(_root)
    owner = _OWNER.get(command or "")
    for name in _MODULES if owner is None else (owner,):
        module = importlib.import_module(f"clusterctl.cli.{name}")
        if name in _GROUPS:
            app.add_typer(module.app, name=name)
        else:
            module.register(app)
    return app


def _command_name(argv: list[str]) -> str | None:
    """The top-level command in ``argv``: the first word that is not an option."""
    return next((a for a in argv if not a.startswith("-")), None)


def _subcommand_alias(args: list[str]) -> list[str]:
    """``doctor ack ...`` runs the ``doctor-ack`` command (``doctor`` itself takes a host pattern)."""
    i = next((n for n, a in enumerate(args) if not a.startswith("-")), None)
    if i is not None and args[i : i + 2] == ["doctor", "ack"]:
        return args[:i] + ["doctor-ack"] + args[i + 2 :]
    return args


def __getattr__(name: str) -> typer.Typer:
    if name == "app":  # the whole app, for tools that introspect it
        return build_app()
    raise AttributeError(name)


def _debug_flag(args: list[str]) -> tuple[list[str], bool]:
    """``args`` without ``--debug`` (before any ``--``), and whether it was there."""
    end = args.index("--") if "--" in args else len(args)
    kept = [a for a in args[:end] if a != "--debug"] + args[end:]
    return kept, len(kept) != len(args) or os.environ.get("CLUSTERCTL_DEBUG", "") not in ("", "0")


def _unexpected(e: BaseException, debug: bool) -> int:
    """The safety net: one line (and the traceback with ``--debug``), exit 3 (UNKNOWN)."""
    if debug:
        traceback.print_exception(e)
    text = " ".join(str(e).split())
    text = f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__
    hint = "" if debug else "; run again with --debug for the traceback"
    print(f"error: unexpected internal error ({text}){hint}", file=sys.stderr)
    return USAGE_ERROR


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the app and map errors to exit codes."""
    args, debug = _debug_flag(sys.argv[1:] if argv is None else list(argv))
    args = _subcommand_alias(args)
    bind_state_dir(None)  # each command binds its own cluster's state (cli/_common.load_inventory)
    try:
        rv = build_app(_command_name(args))(args=args, prog_name="clusterctl", standalone_mode=False)
    except Exit as e:
        return e.exit_code
    except NoArgsIsHelpError as e:  # a bare group: its help is the answer
        print(e.format_message() if hasattr(e, "format_message") else e)
        return 0
    except ClickException as e:  # usage errors, bad parameters
        e.show()
        return USAGE_ERROR
    except Abort as e:
        if isinstance(e.__cause__, EOFError):  # click turns any EOFError into Abort: not a Ctrl-C
            return _unexpected(e.__cause__, debug)
        print("Aborted.", file=sys.stderr)
        return INTERRUPTED
    except KeyboardInterrupt:
        print("Interrupted.", file=sys.stderr)
        return INTERRUPTED
    except ClusterctlError as e:
        print(f"error: {e}", file=sys.stderr)
        return USAGE_ERROR
    except Exception as e:  # the net: every case still deserves its own clear error (issue 21)
        return _unexpected(e, debug)
    return rv if isinstance(rv, int) else 0


if __name__ == "__main__":
    sys.exit(main())
