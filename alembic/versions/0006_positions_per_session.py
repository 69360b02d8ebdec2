"""Items ordered by a per-session position; every key leads with ``session_id``.

A distributed engine (Citus, Vitess, YugabyteDB, CockroachDB, TiDB) shards a
table by a key, wants every primary and unique key to contain it, and promises
no increasing sequence across nodes. So:

* the sessions table gains ``last_position`` (the highest position handed out
  in the session), backfilled from its items;
* the messages table's global ``id`` gives way to ``position``, numbered per
  session in the old order (``ROW_NUMBER() OVER (PARTITION BY session_id ORDER
  BY id)``), with the primary key ``(session_id, position)``;
* the structure rows point at their item by ``(session_id, message_position)``
  (a composite foreign key, ``ON DELETE CASCADE``) and are keyed by
  ``(session_id, branch_id, sequence_number)``; the usage rows by ``(session_id,
  branch_id, user_turn_number)``; their surrogate ids go, and every index leads
  with ``session_id``.

SQLite rebuilds the three tables (create the new shape, copy, drop, rename, with
foreign keys off: ``rebuild_guard``); Postgres and MySQL change them in place
(add and fill the new columns, swap the keys, drop the ids). The hash-partitioned
Postgres layout (``partitions=N`` at upgrade: ``agents_memory._migrations._layout``)
needs a rebuild, since a table cannot become partitioned in place: the numbered
messages table is renamed aside, the new one created ``PARTITION BY HASH
(session_id)`` with its ``N`` partitions (``TableNames.partition``), the rows copied
in, the old table dropped. Its downgrade first copies the rows back into a plain
table, then steps down in place.

The downgrade gives every item an ``id`` again, numbered by ``ROW_NUMBER() OVER
(ORDER BY created_at, session_id, position)`` (each session's order kept), and
restores 0005's keys and foreign keys.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from agents_memory._migrations._layout import PARTITIONS_KEY, CreateHashPartition
from agents_memory._tables import suffixed
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# Frozen copies of the types at this revision (never import the live models here).
MYSQL = ("mysql", "mariadb")
PG_NAME_LIMIT = 63
ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
SESSION_ID = sa.String(255)
BRANCH_ID = sa.String(255)
TIMESTAMP = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), *MYSQL)
MESSAGE_DATA = sa.Text().with_variant(mysql.LONGTEXT(), *MYSQL)
PK = "pk_%(table_name)s"
FK = "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s"
IX = "idx_%(table_name)s_%(column_0_name)s"
UQ = "uq_%(table_name)s_%(column_0_name)s"
STRUCTURE_DATA = (
    "branch_id",
    "message_type",
    "sequence_number",
    "user_turn_number",
    "branch_turn_number",
    "tool_name",
    "created_at",
)
USAGE_DATA = (
    "requests",
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "input_tokens_details",
    "output_tokens_details",
    "created_at",
)
USAGE_KEY = ("session_id", "branch_id", "user_turn_number")


def _names() -> Any:  # noqa: ANN401
    return op.get_context().opts["agents_memory_tables"]


def _dialect() -> str:
    return str(op.get_context().dialect.name)


def _partitions() -> int | None:
    """The hash partitions asked for (Postgres only; the runner refuses them elsewhere)."""
    value = op.get_context().opts.get(PARTITIONS_KEY)
    return int(value) if value else None


def _now() -> Any:  # noqa: ANN401
    if _dialect() in MYSQL:
        return sa.text("CURRENT_TIMESTAMP(6)")
    return sa.func.current_timestamp()


def _pk(table: str) -> Any:  # noqa: ANN401
    return op.f(PK % {"table_name": table})


def _fk(table: str, column: str, referred: str) -> Any:  # noqa: ANN401
    return op.f(
        FK % {"table_name": table, "column_0_name": column, "referred_table_name": referred}
    )


def _ix(table: str, column: str) -> Any:  # noqa: ANN401
    return op.f(IX % {"table_name": table, "column_0_name": column})


def _pk_of(table: str) -> Any:  # noqa: ANN401
    """The primary key's name as the table has it.

    0001 adopted tables the Agents SDK or the seed created with their own key names
    (Postgres' ``<table>_pkey``), so only ours are sure to follow the convention.
    """
    if op.get_context().as_sql:
        return _pk(table)
    name = sa.inspect(op.get_bind()).get_pk_constraint(table).get("name")
    return name or _pk(table)


def _indexes_on(table: str, columns: list[str]) -> list[str]:
    """The names of ``table``'s indexes on exactly ``columns`` (MySQL: what is left of one)."""
    if op.get_context().as_sql:
        return [_ix(table, columns[0])]
    found = sa.inspect(op.get_bind()).get_indexes(table)
    return [str(i["name"]) for i in found if list(i["column_names"]) == columns]


def _copy(target: str, columns: list[str], rows: sa.Select[Any]) -> None:
    """``INSERT INTO target (columns) <rows>``: SQLite's copies into the rebuilt tables."""
    op.execute(_t(target, *columns).insert().from_select(columns, rows))


def _t(name: str, *columns: str) -> sa.TableClause:
    return sa.table(name, *(sa.column(c) for c in columns))


# -- shapes (SQLite rebuilds them; the others reach them in place) -------------------------------


def _created_at() -> sa.Column[Any]:
    return sa.Column("created_at", TIMESTAMP, server_default=_now(), nullable=False)


def _session_fk(names: Any, table: str) -> sa.Column[Any]:  # noqa: ANN401
    fk = sa.ForeignKey(
        f"{names.sessions}.session_id",
        ondelete="CASCADE",
        name=_fk(table, "session_id", names.sessions),
    )
    return sa.Column("session_id", SESSION_ID, fk, nullable=False)


def _structure_common() -> list[sa.Column[Any]]:
    return [
        sa.Column("branch_id", BRANCH_ID, nullable=False),
        sa.Column("message_type", sa.Text(), nullable=False),
        sa.Column("sequence_number", sa.BigInteger(), nullable=False),
        sa.Column("user_turn_number", sa.Integer(), nullable=True),
        sa.Column("branch_turn_number", sa.Integer(), nullable=True),
        sa.Column("tool_name", sa.Text(), nullable=True),
        _created_at(),
    ]


def _usage_common() -> list[sa.Column[Any]]:
    counts = ("requests", "input_tokens", "output_tokens", "total_tokens")
    return [
        sa.Column("branch_id", BRANCH_ID, nullable=False),
        sa.Column("user_turn_number", sa.Integer(), nullable=False, autoincrement=False),
        *(sa.Column(c, sa.BigInteger(), nullable=False) for c in counts),
        sa.Column("input_tokens_details", sa.Text(), nullable=True),
        sa.Column("output_tokens_details", sa.Text(), nullable=True),
        _created_at(),
    ]


def _create_head(names: Any, temp: dict[str, str]) -> None:  # noqa: ANN401
    """SQLite: 0006's messages, structure and usage tables under the names in ``temp``."""
    m, st, u = temp["messages"], temp["structure"], temp["usage"]
    op.create_table(
        m,
        _session_fk(names, names.messages),
        sa.Column("position", sa.BigInteger(), nullable=False, autoincrement=False),
        sa.Column("message_data", MESSAGE_DATA, nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint("session_id", "position", name=_pk(names.messages)),
    )
    op.create_table(
        st,
        _session_fk(names, names.structure),
        sa.Column("message_position", sa.BigInteger(), nullable=False),
        *_structure_common(),
        sa.PrimaryKeyConstraint(
            "session_id", "branch_id", "sequence_number", name=_pk(names.structure)
        ),
        sa.ForeignKeyConstraint(
            ["session_id", "message_position"],
            [f"{names.messages}.session_id", f"{names.messages}.position"],
            ondelete="CASCADE",
            name=_fk(names.structure, "message_position", names.messages),
        ),
    )
    op.create_table(
        u,
        _session_fk(names, names.turn_usage),
        *_usage_common(),
        sa.PrimaryKeyConstraint(*USAGE_KEY, name=_pk(names.turn_usage)),
    )


def _create_0005(names: Any, temp: dict[str, str]) -> None:  # noqa: ANN401
    """SQLite: 0005's three tables under the names in ``temp`` (the downgrade's target)."""
    m, st, u = temp["messages"], temp["structure"], temp["usage"]
    op.create_table(
        m,
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        _session_fk(names, names.messages),
        sa.Column("message_data", MESSAGE_DATA, nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint("id", name=_pk(names.messages)),
        sqlite_autoincrement=True,
    )
    op.create_table(
        st,
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        _session_fk(names, names.structure),
        sa.Column(
            "message_id",
            ID,
            sa.ForeignKey(
                f"{names.messages}.id",
                ondelete="CASCADE",
                name=_fk(names.structure, "message_id", names.messages),
            ),
            nullable=False,
        ),
        *_structure_common(),
        sa.PrimaryKeyConstraint("id", name=_pk(names.structure)),
        sqlite_autoincrement=True,
    )
    op.create_table(
        u,
        sa.Column("id", ID, primary_key=True, autoincrement=True),
        _session_fk(names, names.turn_usage),
        *_usage_common(),
        sa.PrimaryKeyConstraint("id", name=_pk(names.turn_usage)),
        sa.UniqueConstraint(
            *USAGE_KEY,
            name=op.f(UQ % {"table_name": names.turn_usage, "column_0_name": "session_id"}),
        ),
        sqlite_autoincrement=True,
    )


def _temp_names(names: Any) -> dict[str, str]:  # noqa: ANN401
    rebuild = names.derived_names("sqlite")
    return {
        "messages": rebuild["messages_rebuild"],
        "structure": f"{rebuild['messages_rebuild']}_structure",
        "usage": f"{rebuild['messages_rebuild']}_turn_usage",
    }


def _swap(names: Any, temp: dict[str, str]) -> None:  # noqa: ANN401
    """SQLite: drop the old tables and give the new ones their names (foreign keys are off)."""
    for role, final in (
        ("usage", names.turn_usage),
        ("structure", names.structure),
        ("messages", names.messages),
    ):
        op.drop_table(final)
        op.rename_table(temp[role], final)


# -- shared steps -------------------------------------------------------------------------------


def _counters(names: Any) -> None:  # noqa: ANN401
    """Every session's ``last_position``: how many items it holds (they are numbered 1…n)."""
    sessions = _t(names.sessions, "session_id", "last_position")
    messages = _t(names.messages, "session_id", "position")
    top = (
        sa.select(sa.func.coalesce(sa.func.max(messages.c.position), 0))
        .where(messages.c.session_id == sessions.c.session_id)
        .scalar_subquery()
    )
    op.execute(sessions.update().values(last_position=top))


def _ranked_items(names: Any) -> sa.Select[Any]:  # noqa: ANN401
    """``(id, session_id, position)``: each item numbered in its session, in the old order."""
    old = _t(names.messages, "id", "session_id")
    rank = sa.func.row_number().over(partition_by=old.c.session_id, order_by=old.c.id)
    return sa.select(old.c.id, old.c.session_id, rank.label("position"))


def _ranked_ids(names: Any) -> sa.Select[Any]:  # noqa: ANN401
    """``(session_id, position, id)``: the downgrade's ids, each session's order kept."""
    new = _t(names.messages, "session_id", "position", "created_at")
    rank = sa.func.row_number().over(order_by=(new.c.created_at, new.c.session_id, new.c.position))
    return sa.select(new.c.session_id, new.c.position, rank.label("id"))


# -- SQLite -------------------------------------------------------------------------------------


def _sqlite_upgrade(names: Any) -> None:  # noqa: ANN401
    temp = _temp_names(names)
    _create_head(names, temp)
    ranked = _ranked_items(names).subquery("r")
    old = _t(names.messages, "id", "session_id", "message_data", "created_at")
    _copy(
        temp["messages"],
        ["session_id", "position", "message_data", "created_at"],
        sa.select(ranked.c.session_id, ranked.c.position, old.c.message_data, old.c.created_at)
        .join_from(old, ranked, ranked.c.id == old.c.id)
        .order_by(ranked.c.session_id, ranked.c.position),
    )
    st = _t(names.structure, "id", "session_id", "message_id", *STRUCTURE_DATA)
    _copy(
        temp["structure"],
        ["session_id", "message_position", *STRUCTURE_DATA],
        sa.select(st.c.session_id, ranked.c.position, *(st.c[c] for c in STRUCTURE_DATA))
        .join_from(st, ranked, ranked.c.id == st.c.message_id)
        .order_by(st.c.id),
    )
    usage = _t(names.turn_usage, "id", *USAGE_KEY, *USAGE_DATA)
    _copy(
        temp["usage"],
        [*USAGE_KEY, *USAGE_DATA],
        sa.select(*(usage.c[c] for c in (*USAGE_KEY, *USAGE_DATA))).order_by(usage.c.id),
    )
    _swap(names, temp)
    _structure_indexes(names)
    with op.batch_alter_table(names.sessions) as batch:
        batch.add_column(_last_position())
    _counters(names)
    _release_sdk_structure(names)


SDK_STRUCTURE = "message_structure"
SDK_ITEM_FK = "fk_message_structure_message_id"


def _release_sdk_structure(names: Any) -> None:  # noqa: ANN401
    """SQLite: the SDK's own structure table lets go of the items' ``id``.

    A file the SDK's ``AdvancedSQLiteSession`` wrote keeps its ``message_structure``
    (0004 adopted its rows into ours), with a foreign key to ``<messages>(id)``. That
    column is gone now, and SQLite refuses every delete from the messages table while
    a foreign key names a missing parent key ("foreign key mismatch"). The table is
    rebuilt without that one key (its rows and its key to the sessions table kept,
    which 0007 reads to adopt the SDK's clear generations). Not restored by the
    downgrade: the SDK's ids no longer match ours after a round trip anyway.
    """
    insp = sa.inspect(op.get_bind())
    if not insp.has_table(SDK_STRUCTURE):
        return
    to_items = [
        fk
        for fk in insp.get_foreign_keys(SDK_STRUCTURE)
        if fk["referred_table"] == names.messages and fk["constrained_columns"] == ["message_id"]
    ]
    if not to_items:
        return
    convention = {"fk": "fk_%(table_name)s_%(column_0_name)s"}  # names the unnamed keys
    with op.batch_alter_table(
        SDK_STRUCTURE, recreate="always", naming_convention=convention
    ) as batch:
        batch.drop_constraint(SDK_ITEM_FK, type_="foreignkey")


def _sqlite_downgrade(names: Any) -> None:  # noqa: ANN401
    temp = _temp_names(names)
    _create_0005(names, temp)
    ranked = _ranked_ids(names).subquery("r")
    new = _t(names.messages, "session_id", "position", "message_data", "created_at")
    _copy(
        temp["messages"],
        ["id", "session_id", "message_data", "created_at"],
        sa.select(ranked.c.id, new.c.session_id, new.c.message_data, new.c.created_at)
        .join_from(
            new,
            ranked,
            sa.and_(ranked.c.session_id == new.c.session_id, ranked.c.position == new.c.position),
        )
        .order_by(ranked.c.id),
    )
    st = _t(names.structure, "session_id", "message_position", *STRUCTURE_DATA)
    _copy(
        temp["structure"],
        ["session_id", "message_id", *STRUCTURE_DATA],
        sa.select(st.c.session_id, ranked.c.id, *(st.c[c] for c in STRUCTURE_DATA))
        .join_from(
            st,
            ranked,
            sa.and_(
                ranked.c.session_id == st.c.session_id,
                ranked.c.position == st.c.message_position,
            ),
        )
        .order_by(st.c.session_id, st.c.sequence_number),
    )
    usage = _t(names.turn_usage, *USAGE_KEY, *USAGE_DATA)
    _copy(
        temp["usage"],
        [*USAGE_KEY, *USAGE_DATA],
        sa.select(*(usage.c[c] for c in (*USAGE_KEY, *USAGE_DATA))).order_by(
            usage.c.session_id, usage.c.branch_id, usage.c.user_turn_number
        ),
    )
    _swap(names, temp)
    _structure_indexes_0005(names)
    op.create_index(_ix(names.messages, "session_id"), names.messages, ["session_id", "id"])
    with op.batch_alter_table(names.sessions) as batch:
        batch.drop_column("last_position")


# -- Postgres and MySQL: in place ---------------------------------------------------------------


def _last_position() -> sa.Column[Any]:
    return sa.Column("last_position", sa.BigInteger(), server_default=sa.text("0"), nullable=False)


def _structure_indexes(names: Any) -> None:  # noqa: ANN401
    derived = names.derived_names(_dialect())
    op.create_index(
        op.f(derived["structure_turn_index"]),
        names.structure,
        ["session_id", "branch_id", "user_turn_number"],
    )
    op.create_index(
        op.f(derived["structure_item_index"]),
        names.structure,
        ["session_id", "message_position"],
    )


def _structure_indexes_0005(names: Any) -> None:  # noqa: ANN401
    st = names.structure
    op.create_index(_ix(st, "session_id"), st, ["session_id", "branch_id", "sequence_number"])
    op.create_index(_ix(st, "branch_id"), st, ["branch_id", "session_id", "user_turn_number"])
    op.create_index(_ix(st, "message_id"), st, ["message_id"])


def _server_upgrade(names: Any) -> None:  # noqa: ANN401
    is_mysql = _dialect() in MYSQL
    m, st, u = names.messages, names.structure, names.turn_usage
    # 1. number the items per session, and point the structure rows at those numbers
    op.add_column(m, sa.Column("position", sa.BigInteger(), nullable=True))
    ranked = _ranked_items(names).subquery("r")
    items = _t(m, "id", "position")
    op.execute(items.update().values(position=ranked.c.position).where(items.c.id == ranked.c.id))
    op.alter_column(m, "position", existing_type=sa.BigInteger(), nullable=False)
    op.add_column(st, sa.Column("message_position", sa.BigInteger(), nullable=True))
    rows = _t(st, "message_id", "message_position")
    numbered = _t(m, "id", "position")
    op.execute(
        rows.update()
        .values(message_position=numbered.c.position)
        .where(numbered.c.id == rows.c.message_id)
    )
    op.alter_column(st, "message_position", existing_type=sa.BigInteger(), nullable=False)
    # 2. the structure rows let go of the ids
    op.drop_constraint(_fk(st, "message_id", m), st, type_="foreignkey")
    op.drop_index(_ix(st, "message_id"), table_name=st)
    op.drop_column(st, "message_id")
    if not is_mysql:  # (MySQL: an AUTO_INCREMENT column is its key: it goes with it)
        op.drop_constraint(_pk_of(st), st, type_="primary")
    op.drop_column(st, "id")
    op.create_primary_key(_pk(st), st, ["session_id", "branch_id", "sequence_number"])
    op.drop_index(_ix(st, "session_id"), table_name=st)
    op.drop_index(_ix(st, "branch_id"), table_name=st)
    # 3. the items: (session_id, position) is the key; the global id goes
    partitions = _partitions()
    if partitions:
        _rebuild_messages(names, partitions)
    else:
        if not is_mysql:
            op.drop_constraint(_pk_of(m), m, type_="primary")
        # (Postgres drops the index on (session_id, id) with the column; MySQL keeps what
        # is left of it, an index on session_id, made redundant by the new key below)
        op.drop_column(m, "id")
        op.create_primary_key(_pk(m), m, ["session_id", "position"])
        if is_mysql:
            for index in _indexes_on(m, ["session_id"]):
                op.drop_index(op.f(index), table_name=m)
    _structure_indexes(names)
    op.create_foreign_key(
        _fk(st, "message_position", m),
        st,
        m,
        ["session_id", "message_position"],
        ["session_id", "position"],
        ondelete="CASCADE",
    )
    # 4. usage: its natural key
    uq = op.f(UQ % {"table_name": u, "column_0_name": "session_id"})
    if not is_mysql:
        op.drop_constraint(_pk_of(u), u, type_="primary")
    op.drop_column(u, "id")
    op.create_primary_key(_pk(u), u, list(USAGE_KEY))
    op.drop_constraint(uq, u, type_="unique")
    op.add_column(names.sessions, _last_position())
    _counters(names)


def _messages_table(names: Any, name: str, **kw: Any) -> None:  # noqa: ANN401
    """0006's messages table under ``name`` (``kw``: Postgres' partitioning clause)."""
    m = names.messages
    op.create_table(
        name,
        _session_fk(names, m),
        sa.Column("position", sa.BigInteger(), nullable=False, autoincrement=False),
        sa.Column("message_data", MESSAGE_DATA, nullable=False),
        _created_at(),
        sa.PrimaryKeyConstraint("session_id", "position", name=_pk(m)),
        **kw,
    )


def _move_rows(source: str, target: str) -> None:
    columns = ["session_id", "position", "message_data", "created_at"]
    op.execute(_t(target, *columns).insert().from_select(columns, sa.select(_t(source, *columns))))


def _aside(names: Any) -> str:  # noqa: ANN401
    """Where the messages table waits while its rows move to a table of another layout."""
    aside = suffixed(names.messages, "_relayout")
    op.rename_table(names.messages, aside)
    op.drop_constraint(_pk_of(aside), aside, type_="primary")  # (the new table takes the name)
    return aside


def _rebuild_messages(names: Any, partitions: int) -> None:  # noqa: ANN401
    """Postgres: the numbered items into a new table, hash-partitioned by session id."""
    aside = _aside(names)
    _messages_table(names, names.messages, postgresql_partition_by="HASH (session_id)")
    for index in range(partitions):
        op.execute(CreateHashPartition(names.partition(index), names.messages, partitions, index))
    _move_rows(aside, names.messages)
    op.drop_table(aside)


def _unpartition(names: Any) -> None:  # noqa: ANN401
    """Postgres: a partitioned messages table back to a plain one (0006's shape), rows kept.

    Before the in-place downgrade, whose key on ``id`` a partitioned table cannot hold
    (its unique keys must contain the partition key).
    """
    m, st = names.messages, names.structure
    fk = _fk(st, "message_position", m)
    op.drop_constraint(fk, st, type_="foreignkey")
    aside = _aside(names)
    _messages_table(names, m)
    _move_rows(aside, m)
    op.drop_table(aside)  # (its partitions with it)
    op.create_foreign_key(
        fk,
        st,
        m,
        ["session_id", "message_position"],
        ["session_id", "position"],
        ondelete="CASCADE",
    )


def _partitioned(table: str) -> bool:
    """Whether ``table`` is a partitioned table (Postgres' catalog; nothing else has them)."""
    if op.get_context().as_sql or _dialect() != "postgresql":
        return False
    found = op.get_bind().execute(
        sa.text(
            "SELECT 1 FROM pg_catalog.pg_partitioned_table p "
            "JOIN pg_catalog.pg_class c ON c.oid = p.partrelid "
            "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relname = :name AND n.nspname = current_schema()"
        ),
        {"name": table},
    )
    return found.first() is not None


def _server_downgrade(names: Any) -> None:  # noqa: ANN401
    is_mysql = _dialect() in MYSQL
    m, st, u = names.messages, names.structure, names.turn_usage
    derived = names.derived_names(_dialect())
    if _partitioned(m):
        _unpartition(names)
    # 1. ids again, in each session's order
    op.add_column(m, sa.Column("id", sa.BigInteger(), nullable=True))
    ranked = _ranked_ids(names).subquery("r")
    items = _t(m, "session_id", "position", "id")
    op.execute(
        items.update()
        .values(id=ranked.c.id)
        .where(ranked.c.session_id == items.c.session_id, ranked.c.position == items.c.position)
    )
    op.add_column(st, sa.Column("message_id", sa.BigInteger(), nullable=True))
    rows = _t(st, "session_id", "message_position", "message_id")
    op.execute(
        rows.update()
        .values(message_id=items.c.id)
        .where(
            items.c.session_id == rows.c.session_id,
            items.c.position == rows.c.message_position,
        )
    )
    # 2. the items keyed by id (auto-increment continuing after the largest)
    op.drop_constraint(_fk(st, "message_position", m), st, type_="foreignkey")
    op.drop_index(op.f(derived["structure_item_index"]), table_name=st)
    op.drop_index(op.f(derived["structure_turn_index"]), table_name=st)
    op.create_index(_ix(m, "session_id"), m, ["session_id", "id"])
    op.drop_constraint(_pk(m), m, type_="primary")
    if is_mysql:
        op.alter_column(m, "id", existing_type=sa.BigInteger(), nullable=False)
        op.create_primary_key(_pk(m), m, ["id"])
        op.alter_column(m, "id", existing_type=sa.BigInteger(), nullable=False, autoincrement=True)
    else:
        _serial(m)
        op.create_primary_key(_pk(m), m, ["id"])
    op.drop_column(m, "position")
    op.alter_column(st, "message_id", existing_type=sa.BigInteger(), nullable=False)
    op.create_foreign_key(
        _fk(st, "message_id", m), st, m, ["message_id"], ["id"], ondelete="CASCADE"
    )
    # 3. the structure and usage rows get their surrogate ids back
    _structure_indexes_0005(names)
    op.drop_constraint(_pk(st), st, type_="primary")
    op.drop_column(st, "message_position")
    _surrogate_id(st, ("session_id", "sequence_number"))
    uq = op.f(UQ % {"table_name": u, "column_0_name": "session_id"})
    op.create_unique_constraint(uq, u, list(USAGE_KEY))
    op.drop_constraint(_pk(u), u, type_="primary")
    _surrogate_id(u, USAGE_KEY)
    op.drop_column(names.sessions, "last_position")


def _serial(table: str) -> None:
    """Postgres: ``id`` numbered already; make it 0005's ``BIGSERIAL`` (a sequence it owns).

    Core has no construct for a sequence's owner or a ``regclass`` default: these
    three statements are written out, every identifier quoted by the dialect.
    """
    # Named as Postgres names a SERIAL column's sequence: the table's name cut to fit.
    suffix = "_id_seq"
    seq = f"{table[: PG_NAME_LIMIT - len(suffix)]}{suffix}"
    op.execute(sa.schema.CreateSequence(sa.Sequence(op.f(seq))))
    regclass = _quoted(seq).replace("'", "''")
    op.alter_column(
        table,
        "id",
        existing_type=sa.BigInteger(),
        nullable=False,
        server_default=sa.text(f"nextval('{regclass}'::regclass)"),
    )
    op.execute(sa.text(f"ALTER SEQUENCE {_quoted(seq)} OWNED BY {_quoted(table)}.id"))
    column = _t(table, "id")
    top = sa.select(sa.func.coalesce(sa.func.max(column.c.id), 0) + 1).scalar_subquery()
    seq_class = sa.literal_column(f"'{regclass}'::regclass")
    op.execute(sa.select(sa.func.setval(seq_class, top, sa.false())))


def _quoted(name: str) -> str:
    return str(op.get_context().dialect.identifier_preparer.quote(name))


def _surrogate_id(table: str, order: tuple[str, ...]) -> None:
    """0005's ``id`` primary key on ``table`` again, numbered in ``order``."""
    op.add_column(table, sa.Column("id", sa.BigInteger(), nullable=True))
    t = _t(table, "id", *order)
    rank = sa.func.row_number().over(order_by=[t.c[c] for c in order]).label("rn")
    ranked = sa.select(*(t.c[c] for c in order), rank).subquery("r")
    op.execute(t.update().values(id=ranked.c.rn).where(*(ranked.c[c] == t.c[c] for c in order)))
    if _dialect() in MYSQL:
        op.alter_column(table, "id", existing_type=sa.BigInteger(), nullable=False)
        op.create_primary_key(_pk(table), table, ["id"])
        op.alter_column(
            table, "id", existing_type=sa.BigInteger(), nullable=False, autoincrement=True
        )
    else:
        _serial(table)
        op.create_primary_key(_pk(table), table, ["id"])


def upgrade() -> None:
    names = _names()
    if _dialect() == "sqlite":
        _sqlite_upgrade(names)
    else:
        _server_upgrade(names)


def downgrade() -> None:
    names = _names()
    if _dialect() == "sqlite":
        _sqlite_downgrade(names)
    else:
        _server_downgrade(names)
