"""Durable conversation memory for AI agents in a real SQL database.

A drop-in for the OpenAI Agents SDK's session classes: ``SQLAlchemySession`` on
SQLite (the embedded default), Postgres or MySQL/MariaDB, where only the URL
changes between a laptop and production; ``SQLiteSession`` on the stdlib
``sqlite3`` module, over the same tables; and ``OpenAIConversationsSession`` on
OpenAI's Conversations API.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from agents_memory import _protocol, migrations
from agents_memory._crypto import Keyring
from agents_memory._errors import (
    AgentsMemoryError,
    CorruptItemError,
    DatabaseBusyError,
    DatabaseConnectionError,
    DecryptionError,
    MissingKeyError,
    SchemaNotReadyError,
    SessionClosedError,
    SessionNotStartedError,
    UnsupportedDatabaseError,
)
from agents_memory._sqlalchemy._engine import create_engine
from agents_memory._sqlalchemy._rotate import KeyRotationReport
from agents_memory._sqlalchemy._session import SQLAlchemySession
from agents_memory._sqlalchemy._stats import StoreStats
from agents_memory._sqlalchemy._store import SessionInfo, SessionPage, SessionStore
from agents_memory._sqlite_session import SQLiteSession
from agents_memory._tables import TableNames
from agents_memory._urls import DEFAULT_URL, mask_url, normalize_url
from agents_memory.models import get_models

if TYPE_CHECKING:
    from agents_memory._openai_conversations import OpenAIConversationsSession
    from agents_memory._protocol import Session, SessionABC, SessionSettings, TResponseInputItem

_protocol.register_with_sdk()  # the SDK may have been imported first

try:
    __version__ = version("agents-memory")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0"


def __getattr__(name: str) -> Any:  # noqa: ANN401 - module attribute, by name
    """Load on first use what would import the Agents SDK and ``openai`` (about 2 s).

    ``Session``, ``SessionABC``, ``SessionSettings`` and ``TResponseInputItem`` are
    the SDK's own; ``OpenAIConversationsSession`` needs ``openai``.
    """
    if name == "OpenAIConversationsSession":
        from agents_memory._openai_conversations import (  # noqa: PLC0415
            OpenAIConversationsSession,
        )

        value: Any = OpenAIConversationsSession
    elif name in _protocol.SDK_NAMES:
        value = _protocol.sdk_object(name)
    else:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_URL",
    "AgentsMemoryError",
    "CorruptItemError",
    "DatabaseBusyError",
    "DatabaseConnectionError",
    "DecryptionError",
    "KeyRotationReport",
    "Keyring",
    "MissingKeyError",
    "OpenAIConversationsSession",
    "SQLAlchemySession",
    "SQLiteSession",
    "SchemaNotReadyError",
    "Session",
    "SessionABC",
    "SessionClosedError",
    "SessionInfo",
    "SessionNotStartedError",
    "SessionPage",
    "SessionSettings",
    "SessionStore",
    "StoreStats",
    "TResponseInputItem",
    "TableNames",
    "UnsupportedDatabaseError",
    "__version__",
    "create_engine",
    "get_models",
    "mask_url",
    "migrations",
    "normalize_url",
]
