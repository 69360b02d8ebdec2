"""The ``agents-memory`` command: a thin front end that parses arguments and calls _admin."""

from __future__ import annotations

import logging

from agents_memory._cli._app import app


def main() -> None:
    """Console-script entry point."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("warning: %(message)s"))
    logging.getLogger("agents_memory").addHandler(handler)
    app()


__all__ = ["app", "main"]
