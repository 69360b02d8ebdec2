"""The typer application and its global options."""

from __future__ import annotations

import asyncio
import os
from typing import Annotated

import typer

from agents_memory import __version__
from agents_memory._cli._demo import run_demo
from agents_memory._urls import DEFAULT_URL

app = typer.Typer(
    name="agents-memory",
    help="Operate an agents_memory store: conversation history for AI agents in SQL.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"agents-memory {__version__}")
        raise typer.Exit


@app.callback()
def _root(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option(help=f"Database URL (else $AGENTS_MEMORY_URL, else {DEFAULT_URL})."),
    ] = None,
    version: Annotated[  # noqa: ARG001 - handled eagerly by the callback
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    ctx.obj = {"url": url or os.environ.get("AGENTS_MEMORY_URL") or DEFAULT_URL}


@app.command()
def demo(ctx: typer.Context) -> None:
    """Store a short multi-turn agent conversation and print it back.

    Example: [bold]agents-memory demo[/bold]
    """
    asyncio.run(run_demo(ctx.obj["url"]))
