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


class DatabaseConnectionError(AgentsMemoryError, ConnectionError):
    """The database could not be reached, or the connection was lost during an operation.

    The message names the database (its URL with the password masked) and what to
    check. An operation interrupted by a lost connection was applied completely or
    not at all; the next call gets a fresh connection from the pool.
    """


class DatabaseBusyError(AgentsMemoryError, TimeoutError):
    """The database kept refusing the operation's locks: nothing was applied, retry later.

    SQLite: locked by another connection or process for longer than its busy
    timeout (seen when several processes write one file flat out). Postgres and
    MySQL/MariaDB: chosen as a deadlock victim on every automatic retry.
    """


class SessionNotFoundError(AgentsMemoryError, LookupError):
    """The session an operation copies from does not exist (``SessionStore.fork``)."""


class SessionExistsError(AgentsMemoryError, ValueError):
    """The session an operation would create already exists; nothing was written.

    ``SessionStore.fork`` never writes into an existing session: pick another id,
    or delete that session first.
    """


class TurnNotFoundError(AgentsMemoryError, ValueError):
    """The session has no such user turn (``fork(..., at_turn=N)``); nothing was written.

    A ``ValueError``, as the Agents SDK's ``create_branch_from_turn`` raises.
    """


class DecryptionError(AgentsMemoryError, ValueError):
    """A stored item could not be decrypted: a wrong key, or an item altered after writing.

    ``key_id`` names the key the item says it was written under (never the key).
    Nothing was deleted or changed because of it.
    """

    def __init__(self, message: str, *, key_id: str) -> None:
        super().__init__(message)
        self.key_id = key_id


class MissingKeyError(DecryptionError):
    """A stored item is encrypted under a key id the keyring lacks (or there is no keyring)."""
