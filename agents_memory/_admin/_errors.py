"""Errors of the operations layer; each message is one sentence ending in the next step."""

from __future__ import annotations

from agents_memory._errors import AgentsMemoryError


class AdminError(AgentsMemoryError):
    """An operation on a store could not be done as asked."""


class NotFoundError(AdminError, LookupError):
    """A session (or database file) the operation needs does not exist."""


class ConflictError(AdminError):
    """The target already holds data that differs from what would be written there."""


class InvalidFileError(AdminError, ValueError):
    """An import file is not in the export format; nothing was written."""
