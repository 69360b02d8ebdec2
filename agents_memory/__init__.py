"""Durable conversation memory for AI agents in a real SQL database.

A drop-in for the OpenAI Agents SDK's session classes: ``SQLAlchemySession`` on
SQLite (the embedded default), Postgres or MySQL/MariaDB, where only the URL
changes between a laptop and production; ``SQLiteSession`` on the stdlib
``sqlite3`` module, over the same tables; and ``OpenAIConversationsSession`` on
OpenAI's Conversations API.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from agents_memory import _protocol

if TYPE_CHECKING:
    from agents_memory import migrations
    from agents_memory._crypto import Keyring
    from agents_memory._sqlalchemy._advanced import AdvancedSQLAlchemySession, AdvancedSQLiteSession
    from agents_memory._sqlalchemy._prune import PruneReport
    from agents_memory._sqlalchemy._rotate import KeyRotationReport

    __version__: str
    from agents_memory._errors import (
        AgentsMemoryError,
        CorruptItemError,
        DatabaseBusyError,
        DatabaseConnectionError,
        DecryptionError,
        MissingKeyError,
        SchemaNotReadyError,
        SessionClosedError,
        SessionExistsError,
        SessionNotFoundError,
        SessionNotStartedError,
        TurnNotFoundError,
        UnsupportedDatabaseError,
    )
    from agents_memory._openai_conversations import OpenAIConversationsSession
    from agents_memory._protocol import Session, SessionABC, SessionSettings, TResponseInputItem
    from agents_memory._sqlalchemy._engine import create_engine
    from agents_memory._sqlalchemy._session import SQLAlchemySession
    from agents_memory._sqlalchemy._stats import StoreStats
    from agents_memory._sqlalchemy._store import SessionInfo, SessionPage, SessionStore
    from agents_memory._sqlite_session import SQLiteSession
    from agents_memory._tables import TableNames
    from agents_memory._urls import DEFAULT_URL, mask_url, normalize_url
    from agents_memory.models import get_models

_HOMES: dict[str, str] = {
    "KeyRotationReport": "_sqlalchemy._rotate",
    "MissingKeyError": "_errors",
    "DecryptionError": "_errors",
    "Keyring": "_crypto",
    "PruneReport": "_sqlalchemy._prune",
    "AdvancedSQLiteSession": "_sqlalchemy._advanced",
    "AdvancedSQLAlchemySession": "_sqlalchemy._advanced",
    "TurnNotFoundError": "_errors",
    "SessionNotFoundError": "_errors",
    "SessionExistsError": "_errors",
    "AgentsMemoryError": "_errors",
    "CorruptItemError": "_errors",
    "DatabaseBusyError": "_errors",
    "DatabaseConnectionError": "_errors",
    "SchemaNotReadyError": "_errors",
    "SessionClosedError": "_errors",
    "SessionNotStartedError": "_errors",
    "UnsupportedDatabaseError": "_errors",
    "OpenAIConversationsSession": "_openai_conversations",
    "create_engine": "_sqlalchemy._engine",
    "SQLAlchemySession": "_sqlalchemy._session",
    "StoreStats": "_sqlalchemy._stats",
    "SessionInfo": "_sqlalchemy._store",
    "SessionPage": "_sqlalchemy._store",
    "SessionStore": "_sqlalchemy._store",
    "SQLiteSession": "_sqlite_session",
    "TableNames": "_tables",
    "DEFAULT_URL": "_urls",
    "mask_url": "_urls",
    "normalize_url": "_urls",
    "get_models": "models",
}
"""Where each public name lives. Importing ``agents_memory`` loads none of them: each
is imported the first time it is asked for (PEP 562), so ``agents-memory --help``
needs no SQLAlchemy and ``SQLiteSession`` no Alembic, ``openai`` or aiosqlite."""

_protocol.register_with_sdk()  # the SDK may have been imported first


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415 - 0.1 s

    try:
        return version("agents-memory")
    except PackageNotFoundError:  # pragma: no cover - a source tree without install
        return "0.0.0"


def __getattr__(name: str) -> Any:  # noqa: ANN401 - module attribute, by name
    """Import a public name from its module the first time it is asked for.

    ``Session``, ``SessionABC``, ``SessionSettings`` and ``TResponseInputItem`` are
    the SDK's own (importing the SDK loads ``openai``: about 2 s); ``migrations``
    loads Alembic.
    """
    if name == "__version__":
        value: Any = _version()
    elif name in _HOMES:
        value = getattr(import_module(f"{__name__}.{_HOMES[name]}"), name)
    elif name in _protocol.SDK_NAMES:
        value = _protocol.sdk_object(name)
    elif name == "migrations":
        value = import_module(f"{__name__}.migrations")
    else:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "DEFAULT_URL",
    "AdvancedSQLAlchemySession",
    "AdvancedSQLiteSession",
    "AgentsMemoryError",
    "CorruptItemError",
    "DatabaseBusyError",
    "DatabaseConnectionError",
    "DecryptionError",
    "KeyRotationReport",
    "Keyring",
    "MissingKeyError",
    "OpenAIConversationsSession",
    "PruneReport",
    "SQLAlchemySession",
    "SQLiteSession",
    "SchemaNotReadyError",
    "Session",
    "SessionABC",
    "SessionClosedError",
    "SessionExistsError",
    "SessionInfo",
    "SessionNotFoundError",
    "SessionNotStartedError",
    "SessionPage",
    "SessionSettings",
    "SessionStore",
    "StoreStats",
    "TResponseInputItem",
    "TableNames",
    "TurnNotFoundError",
    "UnsupportedDatabaseError",
    "__version__",
    "create_engine",
    "get_models",
    "mask_url",
    "migrations",
    "normalize_url",
]
