"""The ``agents-memory`` command: a thin front end that parses arguments and calls the library."""

from __future__ import annotations

from agents_memory._cli._app import app


def main() -> None:
    """Console-script entry point."""
    app()


__all__ = ["app", "main"]
