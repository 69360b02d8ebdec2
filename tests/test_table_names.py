"""Every table-name pair the validator accepts works on every database.

Mixed case, reserved words and the longest allowed names go through the
migrations (upgrade, check, downgrade to base, upgrade again), through the
adoption of tables made before migrations existed, and through a store's whole
protocol. On a server the tests drop their tables (quoted, mixed-case names
included) with SQLAlchemy constructs, never with hand-written SQL.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from alembic.operations import Operations
from alembic.runtime.migration import MigrationContext
from sqlalchemy import (
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    bindparam,
    func,
    inspect,
    select,
    text,
)
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.schema import CreateIndex, CreateTable

from agents_memory import SessionStore, TableNames, create_engine, migrations
from agents_memory._tables import NAMING_CONVENTION
from agents_memory.models import get_models, migration_lock_table

TAG = uuid.uuid4().hex[:8]
"""Per run, so mixed-case and long names never meet another run's tables on a shared server."""


def _long(prefix: str, fill: str) -> str:
    return (f"{prefix}_{TAG}_" + fill * 63)[:63]


PAIRS = {
    "mixed-case": TableNames(f"Chat_{TAG}_Sessions", f"Chat_{TAG}_Messages"),
    "user-order": TableNames("user", "order"),
    "select-group": TableNames("select", "group"),
    "KEY-Values": TableNames("KEY", "Values"),
    "longest": TableNames(_long("long_s", "s"), _long("long_m", "m")),
}
"""Reserved words cannot carry a tag: a concurrent run using the same words would clash."""

ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": "hello ünïcode 😀"},
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    {"role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
]

DIALECTS: dict[str, Dialect] = {
    "postgresql": postgresql.dialect(),
    "mysql": mysql.dialect(),
    "sqlite": sqlite.dialect(),
}


def kw(names: TableNames) -> dict[str, str]:
    return {"sessions_table": names.sessions, "messages_table": names.messages}


def _drop_set(conn: Connection, names: TableNames) -> None:
    """Drop a set's tables, version tables included, with quoted names (messages first: FK)."""
    tables = [
        *reversed(names.tables),
        names.version_table,
        names.legacy_version_table,
        names.migration_lock_table,
    ]
    for table in tables:
        if table is not None:
            Table(table, MetaData()).drop(conn, checkfirst=True)


async def drop_sets(engine: AsyncEngine, *sets: TableNames) -> None:
    async with engine.begin() as conn:
        for names in sets:
            await conn.run_sync(_drop_set, names)


async def table_names_in(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as conn:
        return set(await conn.run_sync(lambda c: inspect(c).get_table_names()))


@pytest.fixture(params=list(PAIRS), ids=list(PAIRS))
def pair(request: pytest.FixtureRequest) -> TableNames:
    """One of the awkward name sets."""
    return PAIRS[request.param]


@pytest.fixture
async def db(backend: Any, pair: TableNames) -> AsyncIterator[AsyncEngine]:
    """An engine on the backend; the pair's tables are dropped before (leftovers) and after."""
    engine = create_engine(backend.url)
    try:
        if backend.kind != "sqlite":
            await drop_sets(engine, pair)
        yield engine
    finally:
        if backend.kind != "sqlite":
            await drop_sets(engine, pair)
        await engine.dispose()


# --- the derived names are the ones SQLAlchemy and Alembic render ---------------------------


def _names_in_ddl(names: TableNames, dialect: Dialect) -> set[str]:
    """Constraint and index names in the models' DDL as compiled for ``dialect``."""
    found: set[str] = set()
    for table in get_models(names).metadata.sorted_tables:
        ddl = [str(CreateTable(table).compile(dialect=dialect))]
        ddl += [str(CreateIndex(ix).compile(dialect=dialect)) for ix in table.indexes]
        for statement in ddl:
            found.update(re.findall(r"(?:CONSTRAINT|CREATE INDEX) [`\"]?(\w+)", statement))
    return found


def _version_table_key(names: TableNames, dialect: str) -> str:
    """The primary key name Alembic gives the version table, as compiled for ``dialect``."""
    context = MigrationContext.configure(
        dialect_name=dialect, opts={"version_table": names.version_table, "as_sql": True}
    )
    ddl = str(CreateTable(context._version).compile(dialect=DIALECTS[dialect]))
    (key,) = re.findall(r"CONSTRAINT [`\"]?(\w+)", ddl)
    return key


@pytest.mark.parametrize("dialect", list(DIALECTS))
@pytest.mark.parametrize(
    "names",
    [*PAIRS.values(), TableNames(), TableNames("S" * 63, "m" * 63), TableNames("s" * 51, "m")],
)
def test_derived_names_match_compiled_ddl(names: TableNames, dialect: str) -> None:
    """derived_names() holds exactly the names SQLAlchemy/Alembic compile, all within the limit.

    SQLAlchemy shortens naming-convention names past a dialect's limit (63 on
    Postgres, 64 on MySQL, none on SQLite); the version table's key is Alembic's
    plain ``<version_table>_pkc``, which compiles only because it already fits.
    """
    derived = names.derived_names(dialect)
    in_ddl = _names_in_ddl(names, DIALECTS[dialect])
    assert in_ddl <= set(derived.values())
    assert derived["messages_fk"] in in_ddl
    assert derived["structure_item_fk"] in in_ddl
    assert derived["structure_turn_index"] in in_ddl
    assert derived["structure_item_index"] in in_ddl
    assert derived["sessions_updated_at_index"] in in_ddl
    assert derived["sessions_pk"] in in_ddl
    assert _version_table_key(names, dialect) == derived["version_table_pk"]
    lock_ddl = str(CreateTable(migration_lock_table(names)).compile(dialect=DIALECTS[dialect]))
    assert derived["migration_lock_table"] == names.migration_lock_table in lock_ddl
    assert re.findall(r"CONSTRAINT [`\"]?(\w+)", lock_ddl) == [derived["migration_lock_pk"]]
    if dialect != "sqlite":
        assert max(len(n) for n in (*derived.values(), *in_ddl)) <= 63


def test_naming_convention_is_unchanged() -> None:
    """Existing databases carry these names; changing one needs a migration."""
    assert NAMING_CONVENTION == {
        "ix": "idx_%(table_name)s_%(column_0_name)s",
        "uq": "uq_%(table_name)s_%(column_0_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }


# --- migrations -------------------------------------------------------------------------------


async def test_migrations_round_trip(backend: Any, db: AsyncEngine, pair: TableNames) -> None:
    """Upgrade, check, downgrade to base and upgrade again, with awkward names."""
    assert await migrations.current(db, **kw(pair)) is None
    await migrations.upgrade(db, **kw(pair))
    assert await migrations.current(db, **kw(pair)) == migrations.head()
    assert await migrations.check(db, **kw(pair)) == []
    present = await table_names_in(db)
    assert {pair.sessions, pair.messages, pair.version_table} <= present

    await migrations.downgrade(db, revision="base", **kw(pair))
    assert await migrations.current(db, **kw(pair)) is None
    assert {pair.sessions, pair.messages}.isdisjoint(await table_names_in(db))

    await migrations.upgrade(db, **kw(pair))
    assert await migrations.current(db, **kw(pair)) == migrations.head()
    assert await migrations.check(db, **kw(pair)) == []


async def test_created_names_are_the_derived_names(
    backend: Any, db: AsyncEngine, pair: TableNames
) -> None:
    """The keys, indexes and foreign key the database reports are the ones derived_names() says."""
    await migrations.upgrade(db, **kw(pair))

    def reflect(conn: Connection) -> set[str]:
        insp = inspect(conn)
        found: set[str] = set()
        for table in (pair.sessions, pair.messages):
            found.update(str(ix["name"]) for ix in insp.get_indexes(table))
            found.update(str(fk["name"]) for fk in insp.get_foreign_keys(table) if fk["name"])
            pk = insp.get_pk_constraint(table).get("name")
            if pk and pk != "PRIMARY":  # MySQL/MariaDB call every primary key PRIMARY
                found.add(str(pk))
        return found

    async with db.connect() as conn:
        found = await conn.run_sync(reflect)
    dialect = "mysql" if backend.kind == "mysql" else db.dialect.name
    assert found
    assert found <= set(pair.derived_names(dialect).values())


def _early_tables(names: TableNames) -> tuple[MetaData, Table, Table]:
    """The shape the seed (and early create_tables) made: int4 ids, nullable times."""
    md = MetaData(naming_convention=NAMING_CONVENTION)
    sessions = Table(
        names.sessions,
        md,
        Column("session_id", String(255), primary_key=True),
        Column("created_at", DateTime, nullable=True),
        Column("updated_at", DateTime, nullable=True),
    )
    messages = Table(
        names.messages,
        md,
        Column("id", Integer, primary_key=True, autoincrement=True),
        Column(
            "session_id",
            String(255),
            ForeignKey(sessions.c.session_id, ondelete="CASCADE"),
            nullable=False,
        ),
        Column("message_data", Text, nullable=False),
        Column("created_at", DateTime, nullable=True),
        Index(None, "session_id", "id"),
        sqlite_autoincrement=True,
    )
    return md, sessions, messages


async def test_tables_made_before_migrations_are_adopted(
    backend: Any, db: AsyncEngine, pair: TableNames
) -> None:
    """Adoption's hand-written statements (times, MySQL's ALTERs, Postgres' sequence) quote names.

    Rows with no times get one, every row survives with its id, and on Postgres
    the SERIAL column's sequence is widened with the column.
    """
    md, sessions, messages = _early_tables(pair)
    async with db.begin() as conn:
        await conn.run_sync(md.create_all)
        await conn.execute(sessions.insert(), [{"session_id": "s1"}, {"session_id": "s2"}])
        await conn.execute(
            messages.insert(),
            [
                {"session_id": sid, "message_data": json.dumps(i)}
                for sid in ("s1", "s2")
                for i in ITEMS
            ],
        )
    # adoption is 0001's work: look at the ids at 0005, the last revision that has them
    await migrations.upgrade(db, revision="0005", **kw(pair))
    models = get_models(pair).metadata.tables
    async with db.begin() as conn:
        m = await conn.run_sync(lambda c: Table(pair.messages, MetaData(), autoload_with=c))
        rows = (await conn.execute(select(m.c.id, m.c.message_data).order_by(m.c.id))).all()
        assert [json.loads(r.message_data) for r in rows] == ITEMS * 2
        assert [r.id for r in rows] == list(range(1, 2 * len(ITEMS) + 1))
        s = models[pair.sessions]
        untimed = select(func.count()).select_from(s).where(s.c.created_at.is_(None))
        assert (await conn.execute(untimed)).scalar() == 0
        await conn.execute(m.insert().values(session_id="s1", message_data="{}"))
        assert (await conn.execute(select(func.max(m.c.id)))).scalar() == 2 * len(ITEMS) + 1
        if backend.kind == "postgres":
            quoted = db.dialect.identifier_preparer.quote(pair.messages)
            seq_type = await conn.execute(
                text(
                    "SELECT CAST(seqtypid AS regtype)::text FROM pg_sequence "
                    "WHERE seqrelid = CAST(pg_get_serial_sequence(:t, 'id') AS regclass)"
                ).bindparams(bindparam("t", quoted))
            )
            assert seq_type.scalar() == "bigint"
    # and at head: each session's items numbered in that order
    await migrations.upgrade(db, **kw(pair))
    assert await migrations.current(db, **kw(pair)) == migrations.head()
    assert await migrations.check(db, **kw(pair)) == []
    store = SessionStore(db, **kw(pair))
    assert await store.session("s1").get_items() == [*ITEMS, {}]
    assert await store.session("s2").get_items() == ITEMS
    head = models[pair.messages]
    async with db.connect() as conn:
        query = select(head.c.session_id, head.c.position).order_by(
            head.c.session_id, head.c.position
        )
        found = [(str(a), int(b)) for a, b in (await conn.execute(query)).all()]
    assert found == [("s1", p) for p in range(1, len(ITEMS) + 2)] + [
        ("s2", p) for p in range(1, len(ITEMS) + 1)
    ]


async def test_a_legacy_version_table_carries_its_lineage_on(backend: Any) -> None:
    """A version table under its name from earlier releases is renamed; the lineage continues.

    Sessions names of 52-63 characters had such a name (workable only on SQLite,
    and MariaDB at 52 characters).
    """
    names = TableNames(f"Legacy_{TAG}_" + "s" * 39, f"Legacy_{TAG}_messages")
    assert len(names.sessions) == 55
    legacy = names.legacy_version_table
    assert legacy == f"{names.sessions}_version"
    engine = create_engine(backend.url)
    try:
        await migrations.upgrade(engine, **kw(names))

        def make_legacy(conn: Connection) -> None:
            Operations(MigrationContext.configure(conn)).rename_table(names.version_table, legacy)

        async with engine.begin() as conn:
            await conn.run_sync(make_legacy)
        assert await migrations.current(engine, **kw(names)) is None  # as before the rename
        await migrations.upgrade(engine, **kw(names))
        assert await migrations.current(engine, **kw(names)) == migrations.head()
        assert await migrations.check(engine, **kw(names)) == []
        present = await table_names_in(engine)
        assert names.version_table in present
        assert legacy not in present
    finally:
        if backend.kind != "sqlite":
            await drop_sets(engine, names)
        await engine.dispose()


# --- the protocol, through the hot path ------------------------------------------------------


async def test_store_round_trip(backend: Any, db: AsyncEngine, pair: TableNames) -> None:
    """add/get/pop/clear and the listing work with awkward names (create_tables=True)."""
    async with SessionStore.from_url(backend.url, create_tables=True, **kw(pair)) as store:
        session = store.session("s")
        await session.add_items(ITEMS)
        await store.session("t").add_items([{"role": "user", "content": "other"}])
        assert await session.get_items() == ITEMS
        assert await session.get_items(limit=1) == ITEMS[-1:]
        assert await session.pop_item() == ITEMS[-1]
        assert await session.get_items() == ITEMS[:-1]
        page = await store.list_sessions()
        assert {(i.session_id, i.item_count) for i in page.sessions} == {("s", 2), ("t", 1)}
        await session.clear_session()
        assert await session.get_items() == []
        assert await session.pop_item() is None
        assert [i.session_id for i in (await store.list_sessions()).sessions] == ["t"]
        assert await migrations.check(store.engine, **kw(pair)) == []


async def test_case_variants_are_separate_stores_where_names_are_case_sensitive(
    backend: Any,
) -> None:
    """Chat_* and chat_* are two sets on Postgres and MySQL (Linux): neither sees the other.

    SQLite compares table names case-insensitively, so there the two spellings
    name the very same tables, and the stores share their items: which is why a
    single set may not use two spellings of one name.
    """
    upper = TableNames(f"Chat_{TAG}_Case_Sessions", f"Chat_{TAG}_Case_Messages")
    lower = TableNames(upper.sessions.lower(), upper.messages.lower())
    engine = create_engine(backend.url)
    try:
        if backend.kind != "sqlite":
            await drop_sets(engine, upper, lower)
        a = SessionStore(engine, create_tables=True, **kw(upper))
        b = SessionStore(engine, create_tables=True, **kw(lower))
        await a.session("s").add_items([{"from": "upper"}])
        await b.session("s").add_items([{"from": "lower"}])
        if backend.kind == "sqlite":
            both = [{"from": "upper"}, {"from": "lower"}]
            assert await a.session("s").get_items() == both
            assert await b.session("s").get_items() == both
        else:
            assert await a.session("s").get_items() == [{"from": "upper"}]
            assert await b.session("s").get_items() == [{"from": "lower"}]
            await b.session("s").clear_session()
            assert await a.session("s").get_items() == [{"from": "upper"}]
            assert [i.session_id for i in (await b.list_sessions()).sessions] == []
            assert await migrations.check(engine, **kw(upper)) == []
            assert await migrations.check(engine, **kw(lower)) == []
    finally:
        if backend.kind != "sqlite":
            await drop_sets(engine, upper, lower)
        await engine.dispose()


async def test_advanced_sessions_with_awkward_names(
    backend: Any, db: AsyncEngine, pair: TableNames
) -> None:
    """Turns, a branch, usage and a branch deletion under every awkward name set."""
    from types import SimpleNamespace  # noqa: PLC0415

    from agents.usage import Usage  # noqa: PLC0415

    async with SessionStore(db, create_tables=True, **kw(pair)) as store:
        s = store.advanced_session("odd")
        await s.add_items(ITEMS)
        await s.add_items([{"role": "user", "content": "second"}])
        usage = Usage(requests=1, input_tokens=3, output_tokens=4, total_tokens=7)
        await s.store_run_usage(SimpleNamespace(context_wrapper=SimpleNamespace(usage=usage)))
        await s.create_branch_from_turn(2, "b")
        await s.add_items([{"role": "user", "content": "other second"}])
        assert [t["turn"] for t in await s.find_turns_by_content("ünïcode")] == [1]
        assert await s.get_tool_usage() == [("f", 1, 1)]
        assert (await s.get_session_usage() or {})["total_tokens"] == 7
        await s.delete_branch("b", force=True)
        assert await s.get_items() == [*ITEMS, {"role": "user", "content": "second"}]
        await s.clear_session()
        assert await s.list_branches() == []
