"""The one place where table names are validated and every derived name is made.

Every table, foreign key, index and constraint name in the models, the migrations
and the version table comes from a :class:`TableNames`; a table name written as a
literal anywhere else is a bug.

A name set is accepted only if it works on every supported database: each name
the set makes (see :meth:`TableNames.derived_names`) must fit that database's
identifier limit and differ from every other name of the set, compared
case-insensitively as SQLite compares them. Anything else is refused when the
``TableNames`` is made, before a table exists, rather than halfway through a
migration.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import re
from collections.abc import Mapping

MAX_IDENTIFIER_LENGTH = 63
"""Postgres' identifier limit (MySQL/MariaDB allow 64, SQLite has none): the strictest one.

Postgres truncates a longer name it is given silently; SQLAlchemy refuses one it
renders, so every table name and every name derived from it must fit.
"""

IDENTIFIER_LIMITS: dict[str, int | None] = {
    "postgresql": MAX_IDENTIFIER_LENGTH,
    "mysql": 64,
    "mariadb": 64,
    "sqlite": None,
}
"""Each database's identifier limit, by SQLAlchemy dialect name (``None``: no limit).

Constraint and index names past the limit are shortened by SQLAlchemy for that
database (see :func:`_convention_name`); the version table and its key are not,
so they are kept under the strictest limit by construction.
"""

DATABASES = ("postgresql", "mysql", "sqlite")
"""The databases a name set must work on (``mariadb`` names the same rules as ``mysql``)."""

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
past a database's limit (the first ``limit - 8`` characters, ``_`` and four hex
digits of its MD5), the same way every time, so such a name fits and stays stable.
Changing it needs a migration.
"""

DEFAULT_SESSIONS_TABLE = "agent_sessions"
DEFAULT_MESSAGES_TABLE = "agent_messages"

SESSIONS_TABLE_ENV = "AGENTS_MEMORY_SESSIONS_TABLE"
MESSAGES_TABLE_ENV = "AGENTS_MEMORY_MESSAGES_TABLE"
"""The environment variables the CLI and the Alembic environment read table names from."""

VERSION_TABLE_SUFFIX = "_version"
VERSION_KEY_SUFFIX = "_pkc"
"""Alembic names its version table's primary key ``<version_table>_pkc`` (not configurable)."""

MAX_VERSION_TABLE_LENGTH = MAX_IDENTIFIER_LENGTH - len(VERSION_KEY_SUFFIX)
"""59: the longest version table whose primary key name still fits in 63 characters."""

_DIGEST_LENGTH = 8
_SQLITE_RESERVED_PREFIX = "sqlite_"
_SQLITE_REBUILD_PREFIX = "_alembic_tmp_"
"""Alembic's batch mode rebuilds a SQLite table through a copy under this prefix."""


def validate_identifier(name: object, *, what: str = "table name") -> str:
    """Return ``name`` if it is a portable SQL identifier; raise otherwise.

    Only ``[A-Za-z_][A-Za-z0-9_]*`` up to 63 characters passes: a name every
    database stores as given (once quoted), with no escaping to get wrong.
    Reserved words and mixed case pass too; every statement quotes its
    identifiers. SQLite reserves the ``sqlite_`` prefix for itself.
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
        msg = (
            f"invalid {what} {name!r}: at most {MAX_IDENTIFIER_LENGTH} characters "
            f"(Postgres' identifier limit), it has {len(name)}"
        )
        raise ValueError(msg)
    if name.lower().startswith(_SQLITE_RESERVED_PREFIX):
        msg = (
            f"invalid {what} {name!r}: SQLite reserves names starting with "
            f"{_SQLITE_RESERVED_PREFIX!r} (case-insensitively) for itself"
        )
        raise ValueError(msg)
    return name


def _digest(name: str) -> str:
    return hashlib.sha1(name.encode(), usedforsecurity=False).hexdigest()[:_DIGEST_LENGTH]


def version_table_for(sessions: str) -> str:
    """The version table of the lineage whose sessions table is ``sessions``.

    ``<sessions>_version`` whenever it and Alembic's ``<sessions>_version_pkc``
    key fit in 63 characters (sessions names up to 51 characters): the name
    every such database already has, so its lineage carries on. Longer sessions
    names get ``<first 42 characters>_<8 hex digits of SHA-1>_version`` (59
    characters). Those sets could not migrate on Postgres or MySQL before (the
    key name did not fit), only on SQLite and, at 52 characters, MariaDB; the
    runner renames such a database's old table (``legacy_version_table``).
    """
    name = f"{sessions}{VERSION_TABLE_SUFFIX}"
    if len(name) <= MAX_VERSION_TABLE_LENGTH:
        return name
    keep = MAX_VERSION_TABLE_LENGTH - len(VERSION_TABLE_SUFFIX) - _DIGEST_LENGTH - 1
    return f"{sessions[:keep]}_{_digest(sessions)}{VERSION_TABLE_SUFFIX}"


def _legacy_version_table_for(sessions: str) -> str:
    """The version table name agents_memory used before it kept the key name within limits."""
    name = f"{sessions}{VERSION_TABLE_SUFFIX}"
    if len(name) <= MAX_IDENTIFIER_LENGTH:
        return name
    keep = MAX_IDENTIFIER_LENGTH - len(VERSION_TABLE_SUFFIX) - _DIGEST_LENGTH - 1
    return f"{sessions[:keep]}_{_digest(sessions)}{VERSION_TABLE_SUFFIX}"


def _convention_name(name: str, limit: int | None) -> str:
    """A naming-convention name as SQLAlchemy renders it for a database with ``limit``.

    SQLAlchemy shortens a convention name (a ``conv``) past the limit to its
    first ``limit - 8`` characters, ``_`` and the last four hex digits of its
    MD5; tests/test_table_names.py compiles the models' DDL to hold this to it.
    """
    if limit is None or len(name) <= limit:
        return name
    digest = hashlib.md5(name.encode(), usedforsecurity=False).hexdigest()[-4:]
    return f"{name[: limit - 8]}_{digest}"


_ROLES = {
    "sessions": "sessions table",
    "messages": "messages table",
    "version_table": "version table",
    "version_table_pk": "version table's primary key",
    "sessions_pk": "sessions table's primary key",
    "sessions_updated_at_index": "sessions index on updated_at",
    "sessions_expires_at_index": "sessions index on expires_at",
    "messages_pk": "messages table's primary key",
    "messages_index": "messages index on (session_id, id)",
    "messages_fk": "messages table's foreign key",
    "structure": "message structure table (turns and branches)",
    "turn_usage": "turn usage table",
    "branches": "branch names table",
    "structure_pk": "message structure table's primary key",
    "structure_session_fk": "message structure table's foreign key to the sessions table",
    "structure_message_fk": "message structure table's foreign key to the messages table",
    "structure_session_index": "message structure index on (session_id, branch_id, sequence)",
    "structure_branch_index": "message structure index on (branch_id, session_id, turn)",
    "structure_message_index": "message structure index on message_id",
    "structure_item_fk": "message structure table's foreign key to the messages table's key",
    "structure_turn_index": "message structure index on (session_id, branch_id, turn)",
    "structure_item_index": "message structure index on (session_id, message_position)",
    "turn_usage_pk": "turn usage table's primary key",
    "turn_usage_fk": "turn usage table's foreign key",
    "turn_usage_unique": "turn usage table's unique key (session_id, branch_id, turn)",
    "branches_pk": "branch names table's primary key",
    "clear_generations": "clear generations table",
    "clear_generations_pk": "clear generations table's primary key",
    "migration_lock_table": "migration lock table",
    "migration_lock_pk": "migration lock table's primary key",
    "sessions_rebuild": "copy Alembic rebuilds the sessions table through",
    "messages_rebuild": "copy Alembic rebuilds the messages table through",
}
"""What each name of :meth:`TableNames.derived_names` is, for error messages."""

_DATABASE_LABELS = {"postgresql": "Postgres", "mysql": "MySQL/MariaDB", "sqlite": "SQLite"}


STRUCTURE_SUFFIX = "_structure"
TURN_USAGE_SUFFIX = "_turn_usage"
BRANCHES_SUFFIX = "_branches"
CLEAR_GENERATIONS_SUFFIX = "_clear_generations"
"""The advanced (branching) sessions' tables are named after the pair:
``<messages>_structure``, ``<sessions>_turn_usage``, ``<sessions>_branches`` and
``<sessions>_clear_generations``."""

MIGRATION_LOCK_SUFFIX = "_migration_lock"
PARTITION_SUFFIX = "_p"
"""``<sessions>_migration_lock``: the one-row table migrators lock where advisory locks fail."""


def suffixed(base: str, suffix: str) -> str:
    """``<base><suffix>``, or, past 63 characters, a shortened base, ``_``, 8 hex digits, suffix.

    The same rule as :func:`version_table_for`: stable, within every database's
    limit, and different for different long bases.
    """
    name = f"{base}{suffix}"
    if len(name) <= MAX_IDENTIFIER_LENGTH:
        return name
    keep = MAX_IDENTIFIER_LENGTH - len(suffix) - _DIGEST_LENGTH - 1
    return f"{base[:keep]}_{_digest(base)}{suffix}"


def _advanced_conventions(s: str, m: str) -> dict[str, str]:
    """The convention names of the advanced tables (before shortening for a database)."""
    structure = suffixed(m, STRUCTURE_SUFFIX)
    usage = suffixed(s, TURN_USAGE_SUFFIX)
    branches = suffixed(s, BRANCHES_SUFFIX)
    generations = suffixed(s, CLEAR_GENERATIONS_SUFFIX)
    ix, fk = NAMING_CONVENTION["ix"], NAMING_CONVENTION["fk"]
    return {
        "structure_pk": NAMING_CONVENTION["pk"] % {"table_name": structure},
        "structure_session_fk": fk
        % {"table_name": structure, "column_0_name": "session_id", "referred_table_name": s},
        "structure_message_fk": fk
        % {"table_name": structure, "column_0_name": "message_id", "referred_table_name": m},
        "structure_session_index": ix % {"table_name": structure, "column_0_name": "session_id"},
        "structure_branch_index": ix % {"table_name": structure, "column_0_name": "branch_id"},
        "structure_message_index": ix % {"table_name": structure, "column_0_name": "message_id"},
        # Revision 0006: every key and index of the structure table leads with session_id;
        # the convention names an index by its first column, so these two are named here.
        # (named after its second column: shortened past a limit, a name ending in the
        # referred table would differ from the sessions key's only in the digest)
        "structure_item_fk": fk
        % {"table_name": structure, "column_0_name": "message_position", "referred_table_name": m},
        "structure_turn_index": ix % {"table_name": structure, "column_0_name": "user_turn_number"},
        "structure_item_index": ix % {"table_name": structure, "column_0_name": "message_position"},
        "turn_usage_pk": NAMING_CONVENTION["pk"] % {"table_name": usage},
        "turn_usage_fk": fk
        % {"table_name": usage, "column_0_name": "session_id", "referred_table_name": s},
        "turn_usage_unique": NAMING_CONVENTION["uq"]
        % {"table_name": usage, "column_0_name": "session_id"},
        "branches_pk": NAMING_CONVENTION["pk"] % {"table_name": branches},
        "clear_generations_pk": NAMING_CONVENTION["pk"] % {"table_name": generations},
    }


def advanced_conventions(names: TableNames) -> dict[str, str]:
    """The advanced tables' constraint and index names before shortening (for the models).

    SQLAlchemy shortens them per database as it does convention names (``conv``).
    """
    return _advanced_conventions(names.sessions, names.messages)


def _derived_names(sessions: str, messages: str, database: str) -> dict[str, str]:
    try:
        limit = IDENTIFIER_LIMITS[database]
    except KeyError:
        msg = f"unknown database {database!r}; expected one of {', '.join(IDENTIFIER_LIMITS)}"
        raise ValueError(msg) from None
    s, m = sessions, messages
    conventions = {
        "sessions_pk": NAMING_CONVENTION["pk"] % {"table_name": s},
        "sessions_updated_at_index": NAMING_CONVENTION["ix"]
        % {"table_name": s, "column_0_name": "updated_at"},
        "sessions_expires_at_index": NAMING_CONVENTION["ix"]
        % {"table_name": s, "column_0_name": "expires_at"},
        "messages_pk": NAMING_CONVENTION["pk"] % {"table_name": m},
        "messages_index": NAMING_CONVENTION["ix"]
        % {"table_name": m, "column_0_name": "session_id"},
        "messages_fk": NAMING_CONVENTION["fk"]
        % {"table_name": m, "column_0_name": "session_id", "referred_table_name": s},
        **_advanced_conventions(s, m),
    }
    lock = suffixed(s, MIGRATION_LOCK_SUFFIX)
    conventions["migration_lock_pk"] = NAMING_CONVENTION["pk"] % {"table_name": lock}
    version = version_table_for(s)
    names = {
        "migration_lock_table": lock,
        "structure": suffixed(m, STRUCTURE_SUFFIX),
        "turn_usage": suffixed(s, TURN_USAGE_SUFFIX),
        "branches": suffixed(s, BRANCHES_SUFFIX),
        "clear_generations": suffixed(s, CLEAR_GENERATIONS_SUFFIX),
        "version_table": version,
        "version_table_pk": f"{version}{VERSION_KEY_SUFFIX}",
        **{role: _convention_name(name, limit) for role, name in conventions.items()},
    }
    if database == "sqlite":
        names["sessions_rebuild"] = f"{_SQLITE_REBUILD_PREFIX}{s}"
        names["messages_rebuild"] = f"{_SQLITE_REBUILD_PREFIX}{m}"
    return names


@functools.lru_cache(maxsize=1024)
def _refusal(sessions: str, messages: str) -> str | None:
    """Why the pair of valid, distinct names cannot work on some database, or ``None``.

    Cached: a store makes a ``TableNames`` per session object, and the answer
    for a pair never changes.
    """
    pair = f"table names {sessions!r}/{messages!r}"
    if messages.lower() == version_table_for(sessions).lower():
        return (
            f"messages table {messages!r} is the name of the version table of sessions table "
            f"{sessions!r} (where the migrations record its schema revision: "
            "<sessions table>_version); choose another messages table name"
        )
    for database in DATABASES:
        limit = IDENTIFIER_LIMITS[database]
        label = _DATABASE_LABELS[database]
        names = {"sessions": sessions, "messages": messages}
        names.update(_derived_names(sessions, messages, database))
        seen: dict[str, tuple[str, str]] = {}
        for role, name in names.items():
            if limit is not None and len(name) > limit:
                return (
                    f"{pair} would make the {_ROLES[role]} {name!r}, {len(name)} characters: "
                    f"over {label}'s identifier limit of {limit} (every name of a set must fit "
                    f"in {MAX_IDENTIFIER_LENGTH}); choose shorter table names"
                )
            other, other_name = seen.setdefault(name.lower(), (role, name))
            if other != role:
                same = repr(name) if name == other_name else f"{other_name!r} and {name!r}"
                return (
                    f"{pair} collide on {label}: the {_ROLES[other]} and the {_ROLES[role]} "
                    f"would be named {same}, the same name to a database that compares names "
                    "case-insensitively as SQLite does (a set must work on every database); "
                    "choose other table names"
                )
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class TableNames:
    """The pair of table names one store lives in, validated on construction.

    Construction refuses (``ValueError``) a pair that could not work on every
    supported database, so nothing is ever created for it anywhere.
    """

    sessions: str = DEFAULT_SESSIONS_TABLE
    messages: str = DEFAULT_MESSAGES_TABLE

    def __post_init__(self) -> None:
        validate_identifier(self.sessions, what="sessions table name")
        validate_identifier(self.messages, what="messages table name")
        if self.sessions.lower() == self.messages.lower():
            msg = (
                "sessions and messages tables must differ (case-insensitively, as SQLite "
                f"compares names), got {self.sessions!r} and {self.messages!r}"
            )
            raise ValueError(msg)
        problem = _refusal(self.sessions, self.messages)
        if problem is not None:
            raise ValueError(problem)

    @property
    def messages_index(self) -> str:
        """The seed's index name on ``(session_id, id)``, kept so seed databases match.

        As the convention writes it; past a database's limit SQLAlchemy shortens
        it (``derived_names(database)["messages_index"]`` is the name it gets there).
        """
        return NAMING_CONVENTION["ix"] % {
            "table_name": self.messages,
            "column_0_name": "session_id",
        }

    @property
    def version_table(self) -> str:
        """Alembic's version table for this name set: one per set, never ``alembic_version``.

        See :func:`version_table_for` for the rule (and why existing lineages keep theirs).
        """
        return version_table_for(self.sessions)

    @property
    def legacy_version_table(self) -> str | None:
        """The version table earlier releases gave this set, where it differs; else ``None``.

        Sessions names of 52-63 characters had a version table whose key name
        did not fit Postgres or MySQL, so those sets could migrate only on
        SQLite (and, at 52 characters, MariaDB). The migration runner renames
        such a table to :attr:`version_table`, so those lineages carry on.
        """
        legacy = _legacy_version_table_for(self.sessions)
        return None if legacy == self.version_table else legacy

    @property
    def migration_lock_table(self) -> str:
        """The one-row table whose row migrators lock when advisory locks do not exclude.

        Not one of :attr:`tables`: it is the lineage's, like the version table, made
        by the migration runner (never by a revision) and dropped at ``base``.
        """
        return suffixed(self.sessions, MIGRATION_LOCK_SUFFIX)

    def partition(self, index: int) -> str:
        """The ``index``-th hash partition of the messages table (partitioned layout only).

        ``<messages>_p<index>``, shortened past 63 characters by the same rule as
        the other suffixed names. Partitions are the layout's, not tables of the set:
        dropping the messages table drops them, and no front end lists them.
        """
        return suffixed(self.messages, f"{PARTITION_SUFFIX}{index}")

    @property
    def tables(self) -> tuple[str, ...]:
        """Every table of this set (the version table aside), parents first."""
        return (
            self.sessions,
            self.messages,
            self.structure,
            self.turn_usage,
            self.branches,
            self.clear_generations,
        )

    @property
    def structure(self) -> str:
        """The advanced sessions' per-item table (branch, turn, sequence, type, tool)."""
        return suffixed(self.messages, STRUCTURE_SUFFIX)

    @property
    def turn_usage(self) -> str:
        """The advanced sessions' token usage per (session, branch, user turn)."""
        return suffixed(self.sessions, TURN_USAGE_SUFFIX)

    @property
    def branches(self) -> str:
        """The advanced sessions' branch names ever used per session (so none is reused)."""
        return suffixed(self.sessions, BRANCHES_SUFFIX)

    @property
    def clear_generations(self) -> str:
        """The advanced sessions' count of clears per session (a stale object's branch resets)."""
        return suffixed(self.sessions, CLEAR_GENERATIONS_SUFFIX)

    def derived_names(self, database: str = "postgresql") -> dict[str, str]:
        """Every name this set makes in ``database`` (a SQLAlchemy dialect name), by role.

        The names that must fit the database's identifier limit and must not
        collide with the tables or with each other (Postgres and SQLite keep
        tables, indexes and primary keys in one namespace): the version table
        and its primary key (Alembic's), and the naming convention's keys,
        indexes and foreign key as SQLAlchemy renders them there, shortened past
        the limit. On SQLite also the copies Alembic's batch mode rebuilds a
        table through. Construction has already checked all of them.
        """
        return _derived_names(self.sessions, self.messages, database)


def resolve_names(given: Mapping[str, str | None]) -> TableNames:
    """The names given (options, ``-x sessions_table=…``), else the environment, else defaults.

    The one rule, for the CLI and the Alembic environment alike.
    """
    return TableNames(
        given.get("sessions_table") or os.environ.get(SESSIONS_TABLE_ENV) or DEFAULT_SESSIONS_TABLE,
        given.get("messages_table") or os.environ.get(MESSAGES_TABLE_ENV) or DEFAULT_MESSAGES_TABLE,
    )
