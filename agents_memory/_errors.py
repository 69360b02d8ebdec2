"""Exceptions raised by agents_memory, each carrying the next step to take."""

from __future__ import annotations


class AgentsMemoryError(Exception):
    """Base class for every error this library raises on purpose."""


class UnsupportedDatabaseError(AgentsMemoryError, ValueError):
    """The URL names a database or driver this library does not support."""


class SchemaNotReadyError(AgentsMemoryError, RuntimeError):
    """The tables are missing or at another revision; the message names the command to run."""


class SessionClosedError(AgentsMemoryError, RuntimeError):
    """An operation was attempted on a session or store after ``close()``."""


class CorruptItemError(AgentsMemoryError, ValueError):
    """A stored row does not hold valid JSON and the store was told to raise on it."""


class SessionNotStartedError(AgentsMemoryError, ValueError, AttributeError):
    """A lazily created remote session has no id yet: it is made by the first call that needs it.

    A ``ValueError`` as in the Agents SDK; also an ``AttributeError``, so that
    ``getattr(session, "session_id", None)`` and ``hasattr`` report "no id yet"
    instead of raising.
    """
