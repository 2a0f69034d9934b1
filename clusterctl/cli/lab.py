"""Placeholder: filled in by its owner."""
import typer
app = typer.Typer(help="lab", no_args_is_help=True)
