"""Placeholder: filled in by its owner."""
import typer
app = typer.Typer(help="inventory", no_args_is_help=True)
