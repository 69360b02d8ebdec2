"""Baseline: the seed-compatible schema, or adopt the tables an earlier store created.

A database written by the seed's ``SQLiteSession``, by the Agents SDK's
``SQLAlchemySession`` or by ``create_tables=True`` before migrations existed
already holds these tables; they are brought to this shape in place, keeping
every row (ids included). On MySQL/MariaDB (where the SDK cannot create its
tables) the same adoption restates every column for InnoDB, utf8mb4,
``LONGTEXT`` and ``DATETIME(6)``.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# Frozen copies of the types at this revision (never import the live models here).
MYSQL = ("mysql", "mariadb")  # a mariadb:// URL gives the dialect its own name
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
SESSION_ID = sa.String(255)
# MySQL's TEXT stops at 64 KiB and its DATETIME at whole seconds.
MESSAGE_DATA = sa.Text().with_variant(mysql.LONGTEXT(), *MYSQL)
TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), *MYSQL)
# Binary (case- and accent-sensitive) collations, NO PAD first (trailing spaces count).
MYSQL_COLLATIONS = ("utf8mb4_0900_bin", "utf8mb4_nopad_bin", "utf8mb4_bin")


def _names() -> Any:  # noqa: ANN401
    return op.get_context().opts["agents_memory_tables"]


def _is_mysql() -> bool:
    return op.get_context().dialect.name in MYSQL


def _now() -> Any:  # noqa: ANN401
    """The column default: a DATETIME(6) on MySQL needs a clock of the same precision."""
    return sa.text("CURRENT_TIMESTAMP(6)") if _is_mysql() else sa.func.current_timestamp()


def _timestamp(name: str) -> sa.Column[Any]:
    return sa.Column(name, TIMESTAMP, server_default=_now(), nullable=False)


def _quote(identifier: str) -> str:
    """``identifier`` quoted for this database where it needs it (mixed case, reserved words).

    The few statements no SQLAlchemy construct or ``op`` function can express
    are written by hand; every identifier in them goes through here.
    """
    return op.get_bind().dialect.identifier_preparer.quote(identifier)


def _mysql_collation() -> str:
    """The first binary utf8mb4 collation this server has (offline: the one every server has)."""
    if op.get_context().as_sql:
        return MYSQL_COLLATIONS[-1]
    name = sa.column("COLLATION_NAME", sa.String())
    query = (
        sa.select(name)
        .select_from(sa.table("COLLATIONS", name, schema="information_schema"))
        .where(name.in_(MYSQL_COLLATIONS))
    )
    present = set(op.get_bind().execute(query).scalars())
    return next((c for c in MYSQL_COLLATIONS if c in present), MYSQL_COLLATIONS[-1])


def _table_options() -> dict[str, str]:
    """InnoDB (row locks, foreign keys) and utf8mb4 with a binary collation on MySQL/MariaDB."""
    if not _is_mysql():
        return {}
    options = {"engine": "InnoDB", "charset": "utf8mb4", "collate": _mysql_collation()}
    return {f"{d}_{k}": v for d in MYSQL for k, v in options.items()}


def _create_sessions(table: str) -> None:
    op.create_table(
        table,
        sa.Column("session_id", SESSION_ID, primary_key=True),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        **_table_options(),
    )


def _create_messages(table: str, sessions: str) -> None:
    op.create_table(
        table,
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        sa.Column(
            "session_id",
            SESSION_ID,
            sa.ForeignKey(f"{sessions}.session_id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("message_data", MESSAGE_DATA, nullable=False),
        _timestamp("created_at"),
        sqlite_autoincrement=True,
        **_table_options(),
    )
    op.create_index(None, table, ["session_id", "id"])  # type: ignore[arg-type]


def _fill_null_times(table: str, columns: list[str]) -> None:
    """Give rows the seed or SDK left without a time one, before the column turns NOT NULL."""
    for column in columns:
        target = sa.table(table, sa.column(column, TIMESTAMP))
        op.execute(
            target.update()
            .where(target.c[column].is_(None))
            .values({column: sa.func.current_timestamp()})
        )


def _adopt(insp: sa.Inspector, names: Any) -> None:  # noqa: ANN401
    """Bring existing seed/SDK/early tables to the baseline shape without losing a row."""
    dialect = op.get_bind().dialect.name
    s_cols = {c["name"]: c for c in insp.get_columns(names.sessions)}
    m_cols = {c["name"]: c for c in insp.get_columns(names.messages)}
    _fill_null_times(names.sessions, [c for c in ("created_at", "updated_at") if c in s_cols])
    _fill_null_times(names.messages, ["created_at"] if "created_at" in m_cols else [])
    if dialect in MYSQL:
        _adopt_mysql(insp, names, s_cols)
        return

    with op.batch_alter_table(
        names.sessions, recreate="always" if dialect == "sqlite" else "auto"
    ) as b:
        # SQLite reports a PRIMARY KEY column without NOT NULL as nullable (seed tables).
        b.alter_column("session_id", type_=SESSION_ID, nullable=False)
        for column in ("created_at", "updated_at"):
            if column in s_cols:
                b.alter_column(
                    column,
                    type_=sa.DateTime(),
                    nullable=False,
                    server_default=sa.func.current_timestamp(),
                )
            else:
                b.add_column(_timestamp(column))

    seed_index_names = {f"idx_{names.messages}_session_time"}
    with op.batch_alter_table(
        names.messages,
        recreate="always" if dialect == "sqlite" else "auto",
        table_kwargs={"sqlite_autoincrement": True},
    ) as b:
        b.alter_column("id", type_=ID, nullable=False)
        b.alter_column("session_id", type_=SESSION_ID, nullable=False)
        b.alter_column(
            "created_at",
            type_=sa.DateTime(),
            nullable=False,
            server_default=sa.func.current_timestamp(),
        )
        for index in insp.get_indexes(names.messages):
            if index["name"] in seed_index_names or index["column_names"] == ["session_id", "id"]:
                b.drop_index(index["name"])  # type: ignore[arg-type]
    if dialect == "postgresql":
        _widen_serial_sequence(names.messages)
    op.create_index(None, names.messages, ["session_id", "id"])  # type: ignore[arg-type]


def _widen_serial_sequence(table: str) -> None:
    """Postgres: a ``SERIAL`` column's sequence is int4 too; widen it with the column.

    ``pg_get_serial_sequence`` parses its argument as SQL would, so it gets the
    quoted table name (as a bound value); the sequence's own schema and name
    come back from the catalogue and are quoted for the ``ALTER``.
    """
    query = sa.text(
        "SELECT n.nspname, c.relname FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.oid = CAST(pg_get_serial_sequence(:table, 'id') AS regclass)"
    )
    found = op.get_bind().execute(query, {"table": _quote(table)}).all()
    for schema, sequence in found:
        op.execute(sa.text(f"ALTER SEQUENCE {_quote(schema)}.{_quote(sequence)} AS BIGINT"))


def _adopt_mysql(insp: sa.Inspector, names: Any, s_cols: dict[str, Any]) -> None:  # noqa: ANN401
    """MySQL/MariaDB: restate each column in full, since ``MODIFY`` keeps nothing implicitly.

    (An ``id`` restated without ``AUTO_INCREMENT`` would lose it.) The foreign
    key is dropped meanwhile and made again after: MariaDB refuses a new
    collation on a referenced column even with foreign-key checks off.
    """
    collation = _quote(_mysql_collation())  # one of MYSQL_COLLATIONS
    now = "DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)"
    s, m = names.sessions, names.messages
    q = _quote
    for fk in insp.get_foreign_keys(m):
        if fk["referred_table"] == s and fk["name"]:
            op.drop_constraint(fk["name"], m, type_="foreignkey")
    for table in (s, m):
        op.execute(
            sa.text(
                f"ALTER TABLE {q(table)} ENGINE=InnoDB, "
                f"CONVERT TO CHARACTER SET utf8mb4 COLLATE {collation}"
            )
        )
    times = [
        f"{'MODIFY' if c in s_cols else 'ADD'} {q(c)} {now}" for c in ("created_at", "updated_at")
    ]
    op.execute(
        sa.text(
            f"ALTER TABLE {q(s)} MODIFY {q('session_id')} VARCHAR(255) NOT NULL, {', '.join(times)}"
        )
    )
    op.execute(
        sa.text(
            f"ALTER TABLE {q(m)} MODIFY {q('id')} BIGINT NOT NULL AUTO_INCREMENT, "
            f"MODIFY {q('session_id')} VARCHAR(255) NOT NULL, "
            f"MODIFY {q('message_data')} LONGTEXT NOT NULL, MODIFY {q('created_at')} {now}"
        )
    )
    indexes = insp.get_indexes(m)
    if not any(index["column_names"] == ["session_id", "id"] for index in indexes):
        op.create_index(None, m, ["session_id", "id"])  # type: ignore[arg-type]
    for index in indexes:
        if index["name"] == f"idx_{m}_session_time":  # the Agents SDK's
            op.drop_index(index["name"], table_name=m)  # type: ignore[arg-type]
    op.create_foreign_key(None, m, s, ["session_id"], ["session_id"], ondelete="CASCADE")  # type: ignore[arg-type]


def upgrade() -> None:
    names = _names()
    if op.get_context().as_sql:  # offline: nothing to inspect, emit the plain DDL
        _create_sessions(names.sessions)
        _create_messages(names.messages, names.sessions)
        return
    insp = sa.inspect(op.get_bind())
    has_sessions = insp.has_table(names.sessions)
    has_messages = insp.has_table(names.messages)
    if has_sessions and has_messages:
        _adopt(insp, names)
        return
    if has_sessions or has_messages:
        missing = names.messages if has_sessions else names.sessions
        msg = (
            f"only one of the agents_memory tables exists ({missing} is missing); "
            "restore it or drop the other before migrating"
        )
        raise RuntimeError(msg)
    _create_sessions(names.sessions)
    _create_messages(names.messages, names.sessions)


def downgrade() -> None:
    names = _names()
    op.drop_table(names.messages)
    op.drop_table(names.sessions)
