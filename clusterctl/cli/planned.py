"""Command groups whose issues have not landed yet.

They are listed in ``--help`` so the shape of the tool is visible, and exit 3
(UNKNOWN: could not run) with a pointer to the issue when called.
"""

from __future__ import annotations

import typer

from clusterctl.exitcodes import USAGE_ERROR

PLANNED: dict[str, tuple[str, int]] = {}


def _planned(name: str, issue: int):
    def command(ctx: typer.Context) -> None:
        typer.echo(f"clusterctl {name}: not available yet (planned in issue #{issue}).", err=True)
        raise typer.Exit(USAGE_ERROR)

    command.__doc__ = PLANNED[name][0]
    return command


def register(app: typer.Typer) -> None:
    for name, (help_text, issue) in PLANNED.items():
        app.command(name, help=help_text, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
            _planned(name, issue)
        )
