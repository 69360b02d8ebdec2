"""Plain types the admin operations share with the CLI, free of SQLAlchemy and Alembic.

The CLI declares its options and progress bars with these at import time;
keeping them here lets ``agents-memory --help`` start without loading the
database stack (see ``benchmarks/startup.py``).
"""

from __future__ import annotations

from typing import Literal, Protocol, TypeAlias

IfExists: TypeAlias = Literal["resume", "skip", "replace", "append"]
"""What to do with a session the target already has (see ``_admin._transfer``)."""
IF_EXISTS: tuple[IfExists, ...] = ("resume", "skip", "replace", "append")


class Progress(Protocol):
    """Where an operation reports how far it is (the CLI draws a bar; tests may count)."""

    def start(self, total: int | None) -> None:
        """The number of items the operation expects to handle (``None``: unknown)."""

    def advance(self, items: int) -> None:
        """``items`` more items were handled (written, or found already present)."""


class NoProgress:
    """Progress reporting that reports nothing."""

    def start(self, total: int | None) -> None:
        """Ignore the total."""

    def advance(self, items: int) -> None:
        """Ignore the step."""
