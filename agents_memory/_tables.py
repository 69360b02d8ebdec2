"""The one place where table names are validated and every derived name is made.

Every table, foreign key, index and constraint name in the models, the migrations
and the version table comes from a :class:`TableNames`; a table name written as a
literal anywhere else is a bug.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

MAX_IDENTIFIER_LENGTH = 63
"""Postgres' limit (MySQL allows 64); names longer than this would be truncated silently."""

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

NAMING_CONVENTION = {
    "ix": "idx_%(table_name)s_%(column_0_name)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
"""Stable, table-derived names for every constraint and index (the index matches the seed's).

Models and migrations both name constraints through it; SQLAlchemy shortens a name
past a backend's limit with a stable hash suffix. Changing it needs a migration.
"""

DEFAULT_SESSIONS_TABLE = "agent_sessions"
DEFAULT_MESSAGES_TABLE = "agent_messages"


def validate_identifier(name: object, *, what: str = "table name") -> str:
    """Return ``name`` if it is a safe, unquoted SQL identifier; raise otherwise.

    Identifiers are interpolated into DDL and into the few hand-written SQL
    statements, so only ``[A-Za-z_][A-Za-z0-9_]*`` up to 63 characters passes.
    """
    if not isinstance(name, str):
        msg = f"{what} must be a str, got {type(name).__name__}"
        raise TypeError(msg)
    if not _IDENTIFIER.match(name):
        msg = (
            f"invalid {what} {name!r}: use letters, digits and underscores, "
            "not starting with a digit"
        )
        raise ValueError(msg)
    if len(name) > MAX_IDENTIFIER_LENGTH:
        msg = f"invalid {what} {name!r}: at most {MAX_IDENTIFIER_LENGTH} characters"
        raise ValueError(msg)
    return name


@dataclasses.dataclass(frozen=True, slots=True)
class TableNames:
    """The pair of table names one store lives in, validated on construction."""

    sessions: str = DEFAULT_SESSIONS_TABLE
    messages: str = DEFAULT_MESSAGES_TABLE

    def __post_init__(self) -> None:
        validate_identifier(self.sessions, what="sessions table name")
        validate_identifier(self.messages, what="messages table name")
        if self.sessions.lower() == self.messages.lower():
            msg = f"sessions and messages tables must differ, both are {self.sessions!r}"
            raise ValueError(msg)

    @property
    def messages_index(self) -> str:
        """The seed's index name on ``(session_id, id)``, kept so seed databases match."""
        return f"idx_{self.messages}_session_id"

    @property
    def version_table(self) -> str:
        """Alembic's version table for this name set: one per set, never ``alembic_version``."""
        name = f"{self.sessions}_version"
        if len(name) <= MAX_IDENTIFIER_LENGTH:
            return name
        digest = hashlib.sha1(self.sessions.encode(), usedforsecurity=False).hexdigest()[:8]
        return f"{self.sessions[: MAX_IDENTIFIER_LENGTH - 17]}_{digest}_version"
