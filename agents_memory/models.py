"""Declarative SQLAlchemy 2.x models for one table-name set, built by a cached factory.

Each :class:`TableNames` gets its own ``DeclarativeBase`` (and so its own
``MetaData``) whose naming convention derives every constraint and index name
from the table it belongs to. That metadata is what Alembic compares the
database with; the hot path uses the same ``Table`` objects through Core.

The default names give the module-level :data:`Session` and :data:`Message`.
"""

from __future__ import annotations

import datetime as dt
import functools
from typing import Any, NamedTuple

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.schema import conv
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

from agents_memory._ids import SESSION_ID_MAX_LENGTH
from agents_memory._tables import NAMING_CONVENTION, TableNames, advanced_conventions

REVISION = "0007"
"""The Alembic revision these models describe: the newest in ``alembic/versions/``.

The stdlib ``SQLiteSession`` creates a fresh file from the models and stamps it
with this revision, without importing Alembic; a test checks it against the
scripts' head, so a new revision cannot land without the models following it.
"""

METADATA_TYPE = JSON().with_variant(postgresql.JSONB(), "postgresql")
"""JSONB on Postgres, so metadata filters can use containment (``@>``)."""

MESSAGE_DATA_TYPE = Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
"""Unbounded text; MySQL's ``TEXT`` stops at 64 KiB, so ``LONGTEXT`` there (up to 4 GiB)."""

TIMESTAMP_TYPE = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
"""MySQL's ``DATETIME`` keeps whole seconds; ``DATETIME(6)`` keeps recent-first listings ordered."""

MYSQL_TABLE_OPTIONS: dict[str, Any] = {
    f"{dialect}_{option}": value
    for dialect in ("mysql", "mariadb")  # a mariadb:// engine reads only its own prefix
    for option, value in (("engine", "InnoDB"), ("charset", "utf8mb4"), ("collate", "utf8mb4_bin"))
}
"""InnoDB (row locks, foreign keys), 4-byte UTF-8 and a binary collation, so session ids that
differ only in case or accents stay distinct. The migrations pick a NO PAD binary collation
where the server has one (then trailing spaces count too); every server has ``utf8mb4_bin``."""


class current_timestamp(FunctionElement[dt.datetime]):  # noqa: N801 - reads as the SQL it is
    """``CURRENT_TIMESTAMP``, to the microsecond on MySQL/MariaDB.

    There a ``DATETIME(6)`` column needs a default of the same precision
    (MySQL refuses a second-precision one); elsewhere it is the plain keyword.
    """

    type = DateTime()
    inherit_cache = True


@compiles(current_timestamp)
def _current_timestamp(_element: current_timestamp, _compiler: SQLCompiler, **_kw: Any) -> str:  # noqa: ANN401
    return "CURRENT_TIMESTAMP"


@compiles(current_timestamp, "mysql")
@compiles(current_timestamp, "mariadb")
def _current_timestamp_mysql(
    _element: current_timestamp,
    _compiler: SQLCompiler,
    **_kw: Any,  # noqa: ANN401
) -> str:
    return "CURRENT_TIMESTAMP(6)"


BRANCH_ID_MAX_LENGTH = 255
"""Branch names are indexed (MySQL indexes at most 3072 bytes: 255 utf8mb4 characters fit)."""


class Models(NamedTuple):
    """The ORM classes and metadata of one table-name set."""

    Session: type[Any]
    Message: type[Any]
    metadata: MetaData
    names: TableNames
    Structure: type[Any]
    """Advanced sessions: one row per item per branch (turn, sequence, type, tool)."""
    TurnUsage: type[Any]
    """Advanced sessions: token usage per (session, branch, user turn)."""
    Branch: type[Any]
    """Advanced sessions: every branch name a session has used (so none is reused)."""
    ClearGeneration: type[Any]
    """Advanced sessions: how many times each session was cleared (stale branches reset)."""


def get_models(names: TableNames | None = None) -> Models:
    """Return the models for ``names`` (the default pair when ``None``), built once per set."""
    return _build(names or TableNames())


@functools.cache
def _build(names_: TableNames) -> Models:

    class Base(DeclarativeBase):
        metadata = MetaData(naming_convention=NAMING_CONVENTION)

    derived = advanced_conventions(names_)

    class Session(Base):
        """One conversation; its row exists while the conversation has been written to."""

        __tablename__ = names_.sessions
        # The only indexes not led by session_id: listings sort every session by these
        # (and fan out across shards anyway); neither is unique.
        __table_args__ = (Index(None, "updated_at"), Index(None, "expires_at"), MYSQL_TABLE_OPTIONS)

        session_id: Mapped[str] = mapped_column(String(SESSION_ID_MAX_LENGTH), primary_key=True)
        created_at: Mapped[dt.datetime] = mapped_column(
            TIMESTAMP_TYPE, server_default=current_timestamp(), nullable=False
        )
        updated_at: Mapped[dt.datetime] = mapped_column(
            TIMESTAMP_TYPE, server_default=current_timestamp(), nullable=False
        )
        session_metadata: Mapped[dict[str, Any] | None] = mapped_column(
            "metadata", METADATA_TYPE, nullable=True
        )
        """Free-form JSON tags (column ``metadata``; the attribute name is SQLAlchemy's own)."""
        expires_at: Mapped[dt.datetime | None] = mapped_column(TIMESTAMP_TYPE, nullable=True)
        """When the session expires (naive UTC); ``NULL``: never. Expired reads as empty."""
        last_position: Mapped[int] = mapped_column(
            BigInteger(), server_default=text("0"), nullable=False
        )
        """The highest item position ever handed out in this session (revision 0006).

        Every writer of items bumps it under the session row's lock (its upsert) and
        numbers its items up to it, so positions are unique, contiguous per batch and
        ordered without any sequence shared across sessions (what sharded engines lack).
        It never decreases while the row lives: a position is never handed out twice.
        """
        messages: Mapped[list[Message]] = relationship(  # type: ignore[valid-type]
            back_populates="session",
            order_by=lambda: Message.position,
            cascade="all, delete-orphan",
            passive_deletes=True,
        )

    class Message(Base):
        """One stored item, its JSON text kept exactly as written.

        Keyed by ``(session_id, position)``: the position is the item's place in its
        session (from the session row's ``last_position``), so every key leads with
        the session id, the shard key of a distributed engine.
        """

        __tablename__ = names_.messages
        __table_args__ = (PrimaryKeyConstraint("session_id", "position"), MYSQL_TABLE_OPTIONS)

        session_id: Mapped[str] = mapped_column(
            String(SESSION_ID_MAX_LENGTH),
            ForeignKey(f"{names_.sessions}.session_id", ondelete="CASCADE"),
            nullable=False,
        )
        position: Mapped[int] = mapped_column(BigInteger(), nullable=False, autoincrement=False)
        message_data: Mapped[str] = mapped_column(MESSAGE_DATA_TYPE, nullable=False)
        created_at: Mapped[dt.datetime] = mapped_column(
            TIMESTAMP_TYPE, server_default=current_timestamp(), nullable=False
        )
        session: Mapped[Session] = relationship(back_populates="messages")

    class Structure(Base):
        """Where an item sits in a branch of an advanced session; plain sessions never write it.

        An item shared by several branches (a branch copies the turns before its
        fork point) has one row per branch and one message row.
        """

        __tablename__ = names_.structure
        __table_args__ = (
            # Sequence numbers are unique in a session (each write takes the session's
            # max + 1 under its lock), so the natural key needs no surrogate id.
            PrimaryKeyConstraint("session_id", "branch_id", "sequence_number"),
            ForeignKeyConstraint(
                ["session_id", "message_position"],
                [f"{names_.messages}.session_id", f"{names_.messages}.position"],
                ondelete="CASCADE",
                name=conv(derived["structure_item_fk"]),
            ),
            Index(
                conv(derived["structure_turn_index"]), "session_id", "branch_id", "user_turn_number"
            ),
            Index(conv(derived["structure_item_index"]), "session_id", "message_position"),
            MYSQL_TABLE_OPTIONS,
        )

        session_id: Mapped[str] = mapped_column(
            String(SESSION_ID_MAX_LENGTH),
            ForeignKey(f"{names_.sessions}.session_id", ondelete="CASCADE"),
            nullable=False,
        )
        message_position: Mapped[int] = mapped_column(BigInteger(), nullable=False)
        """The item's ``position`` in the session (with ``session_id``, its key)."""
        branch_id: Mapped[str] = mapped_column(String(BRANCH_ID_MAX_LENGTH), nullable=False)
        message_type: Mapped[str] = mapped_column(Text(), nullable=False)
        sequence_number: Mapped[int] = mapped_column(BigInteger(), nullable=False)
        user_turn_number: Mapped[int | None] = mapped_column(Integer(), nullable=True)
        branch_turn_number: Mapped[int | None] = mapped_column(Integer(), nullable=True)
        tool_name: Mapped[str | None] = mapped_column(Text(), nullable=True)
        created_at: Mapped[dt.datetime] = mapped_column(
            TIMESTAMP_TYPE, server_default=current_timestamp(), nullable=False
        )

    class TurnUsage(Base):
        """Token usage of one user turn on one branch (``store_run_usage``)."""

        __tablename__ = names_.turn_usage
        __table_args__ = (
            PrimaryKeyConstraint("session_id", "branch_id", "user_turn_number"),
            MYSQL_TABLE_OPTIONS,
        )

        session_id: Mapped[str] = mapped_column(
            String(SESSION_ID_MAX_LENGTH),
            ForeignKey(f"{names_.sessions}.session_id", ondelete="CASCADE"),
            nullable=False,
        )
        branch_id: Mapped[str] = mapped_column(String(BRANCH_ID_MAX_LENGTH), nullable=False)
        user_turn_number: Mapped[int] = mapped_column(
            Integer(), nullable=False, autoincrement=False
        )
        requests: Mapped[int] = mapped_column(BigInteger(), nullable=False, default=0)
        input_tokens: Mapped[int] = mapped_column(BigInteger(), nullable=False, default=0)
        output_tokens: Mapped[int] = mapped_column(BigInteger(), nullable=False, default=0)
        total_tokens: Mapped[int] = mapped_column(BigInteger(), nullable=False, default=0)
        input_tokens_details: Mapped[str | None] = mapped_column(Text(), nullable=True)
        output_tokens_details: Mapped[str | None] = mapped_column(Text(), nullable=True)
        created_at: Mapped[dt.datetime] = mapped_column(
            TIMESTAMP_TYPE, server_default=current_timestamp(), nullable=False
        )

    class Branch(Base):
        """A branch name a session has used; kept after the branch is deleted and after a clear.

        No foreign key (revision 0005): a clear deletes the session row, and the
        SDK keeps the names reserved through it. Deleting a session for good
        (``delete_session``, ``prune``) deletes its names itself.
        """

        __tablename__ = names_.branches
        __table_args__ = (
            PrimaryKeyConstraint("session_id", "branch_id"),
            MYSQL_TABLE_OPTIONS,
        )

        session_id: Mapped[str] = mapped_column(String(SESSION_ID_MAX_LENGTH))
        branch_id: Mapped[str] = mapped_column(String(BRANCH_ID_MAX_LENGTH))
        created_at: Mapped[dt.datetime] = mapped_column(
            TIMESTAMP_TYPE, server_default=current_timestamp(), nullable=False
        )

    class ClearGeneration(Base):
        """How many times an advanced session was cleared: its branches' generation (rev. 0007).

        An object whose current branch is not ``main`` remembers the generation it
        chose that branch in; when another object or process clears the session,
        the count moves on and the object's next operation acts on ``main`` (the
        SDK's ``session_clear_generations``). No row: never cleared (0). No foreign
        key: it outlives the clear, which deletes the session row.
        """

        __tablename__ = names_.clear_generations
        __table_args__ = (MYSQL_TABLE_OPTIONS,)

        session_id: Mapped[str] = mapped_column(String(SESSION_ID_MAX_LENGTH), primary_key=True)
        generation: Mapped[int] = mapped_column(BigInteger(), nullable=False)

    return Models(
        Session=Session,
        Message=Message,
        metadata=Base.metadata,
        names=names_,
        Structure=Structure,
        TurnUsage=TurnUsage,
        Branch=Branch,
        ClearGeneration=ClearGeneration,
    )


_default = get_models()
Session = _default.Session
Message = _default.Message
metadata = _default.metadata

__all__ = ["NAMING_CONVENTION", "Message", "Models", "Session", "get_models", "metadata"]


@functools.lru_cache(maxsize=256)
def legacy_tables(names: TableNames) -> tuple[Table, Table]:
    """``(sessions, messages)`` as the Agents SDK (and the seed) create them: items keyed by ``id``.

    Tables used without migrating (no version table) keep this shape and their
    global auto-increment order; the legacy statements (``Database.statements``
    with ``head=False``) are built on these, the head's on :func:`get_models`.
    """
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    sessions = Table(
        names.sessions,
        metadata,
        Column("session_id", String(SESSION_ID_MAX_LENGTH), primary_key=True),
        Column("created_at", TIMESTAMP_TYPE, server_default=current_timestamp(), nullable=False),
        Column("updated_at", TIMESTAMP_TYPE, server_default=current_timestamp(), nullable=False),
    )
    messages = Table(
        names.messages,
        metadata,
        Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True),
        Column(
            "session_id",
            String(SESSION_ID_MAX_LENGTH),
            ForeignKey(sessions.c.session_id, ondelete="CASCADE"),
            nullable=False,
        ),
        Column("message_data", MESSAGE_DATA_TYPE, nullable=False),
        Column("created_at", TIMESTAMP_TYPE, server_default=current_timestamp(), nullable=False),
    )
    return sessions, messages


@functools.lru_cache(maxsize=256)
def migration_lock_table(names: TableNames) -> Table:
    """The lineage's migration lock table: one row (``id = 1``) that migrators lock in turn.

    Outside :func:`get_models`' metadata on purpose: no revision creates it and
    ``check`` does not compare it; the migration runner makes it on first use where
    advisory locks do not exclude (see ``agents_memory._migrations._lock``).
    """
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    return Table(
        names.migration_lock_table,
        metadata,
        Column("id", Integer, primary_key=True, autoincrement=False),
    )
