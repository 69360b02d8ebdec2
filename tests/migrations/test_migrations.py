"""Alembic owns the schema: round trips, drift checks, independent lineages, clear errors."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from sqlalchemy import inspect, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory import (
    SchemaNotReadyError,
    SessionStore,
    TableNames,
    create_engine,
    get_models,
    migrations,
)


def kw(names: TableNames) -> dict[str, str]:
    return {"sessions_table": names.sessions, "messages_table": names.messages}


async def tables(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as conn:
        return set(await conn.run_sync(lambda c: inspect(c).get_table_names()))


async def test_upgrade_use_downgrade_upgrade(engine: AsyncEngine, names: TableNames) -> None:
    """Upgrade to head, use the store, downgrade to base (tables gone), upgrade again."""
    assert await migrations.current(engine, **kw(names)) is None
    await migrations.upgrade(engine, **kw(names))
    assert await migrations.current(engine, **kw(names)) == migrations.head()
    store = SessionStore(engine, **kw(names))
    await store.session("a").add_items([{"x": 1}])
    assert await store.session("a").get_items() == [{"x": 1}]

    await migrations.downgrade(engine, revision="base", **kw(names))
    assert await migrations.current(engine, **kw(names)) is None
    assert {names.sessions, names.messages}.isdisjoint(await tables(engine))

    await migrations.upgrade(engine, **kw(names))
    fresh = SessionStore(engine, **kw(names))
    assert await fresh.session("a").get_items() == []
    await fresh.session("a").add_items([{"x": 2}])
    assert await fresh.session("a").get_items() == [{"x": 2}]


async def test_data_survives_each_upgrade(engine: AsyncEngine, names: TableNames) -> None:
    """Rows written at the baseline are all there, in order, after upgrading to head."""
    await migrations.upgrade(engine, revision="0001", **kw(names))
    items = [{"i": i, "t": "ü😀"} for i in range(50)]
    async with engine.begin() as conn:
        await conn.execute(text(f"INSERT INTO {names.sessions} (session_id) VALUES ('kept')"))
        for item in items:
            await conn.execute(
                text(
                    f"INSERT INTO {names.messages} (session_id, message_data) VALUES ('kept', :d)"
                ),
                {"d": __import__("json").dumps(item, ensure_ascii=False)},
            )
    await migrations.upgrade(engine, **kw(names))
    store = SessionStore(engine, **kw(names))
    assert await store.session("kept").get_items() == items
    # and back down one step, keeping the rows too
    await migrations.downgrade(engine, revision="0001", **kw(names))
    await migrations.upgrade(engine, **kw(names))
    assert await SessionStore(engine, **kw(names)).session("kept").get_items() == items


async def test_no_drift_at_head(engine: AsyncEngine, names: TableNames) -> None:
    """At head the database matches the models exactly (alembic check finds nothing)."""
    assert await migrations.check(engine, **kw(names)) != []  # nothing there yet
    await migrations.upgrade(engine, **kw(names))
    assert await migrations.check(engine, **kw(names)) == []
    await migrations.downgrade(engine, revision="0001", **kw(names))
    (problem,) = await migrations.check(engine, **kw(names))
    assert "0001" in problem


async def test_two_table_sets_are_independent(engine: AsyncEngine, names: TableNames) -> None:
    """Two sets in one database each have a version table and migrate on their own."""
    other = TableNames(names.sessions + "_b", names.messages + "_b")
    try:
        await migrations.upgrade(engine, **kw(names))
        await migrations.upgrade(engine, revision="0001", **kw(other))
        assert await migrations.current(engine, **kw(names)) == migrations.head()
        assert await migrations.current(engine, **kw(other)) == "0001"
        await SessionStore(engine, **kw(names)).session("s").add_items([{"a": 1}])
        await migrations.downgrade(engine, revision="base", **kw(other))
        assert await SessionStore(engine, **kw(names)).session("s").get_items() == [{"a": 1}]
        present = await tables(engine)
        assert names.version_table in present
        assert "alembic_version" not in present or names.version_table != "alembic_version"
        assert other.sessions not in present
    finally:
        async with engine.begin() as conn:
            for t in (*reversed(other.tables), other.version_table):
                await conn.execute(text(f"DROP TABLE IF EXISTS {t}"))


async def test_app_alembic_version_is_untouched(engine: AsyncEngine, names: TableNames) -> None:
    """An application's own alembic_version table keeps its row through our migrations."""
    app_table = f"{names.sessions}_appver"
    async with engine.begin() as conn:
        await conn.execute(text(f"CREATE TABLE {app_table} (version_num VARCHAR(32) PRIMARY KEY)"))
        await conn.execute(text(f"INSERT INTO {app_table} VALUES ('app123')"))
    try:
        await migrations.upgrade(engine, **kw(names))
        await migrations.downgrade(engine, revision="base", **kw(names))
        async with engine.connect() as conn:
            rows = (await conn.execute(text(f"SELECT version_num FROM {app_table}"))).all()
        assert [r[0] for r in rows] == ["app123"]
    finally:
        async with engine.begin() as conn:
            await conn.execute(text(f"DROP TABLE IF EXISTS {app_table}"))


async def test_missing_schema_names_the_command(engine: AsyncEngine, names: TableNames) -> None:
    """Without create_tables, a missing schema raises an error with the exact command to run."""
    store = SessionStore(engine, **kw(names))
    with pytest.raises(SchemaNotReadyError) as info:
        await store.session("a").get_items()
    message = str(info.value)
    assert "agents-memory db upgrade --url" in message
    assert f"--sessions-table {names.sessions} --messages-table {names.messages}" in message
    assert "has not been created" in message
    # nothing was written by the failed call
    assert await migrations.current(engine, **kw(names)) is None


async def test_out_of_date_schema_names_the_command(engine: AsyncEngine, names: TableNames) -> None:
    """A schema behind head raises SchemaNotReadyError naming its revision and the fix."""
    await migrations.upgrade(engine, revision="0001", **kw(names))
    store = SessionStore(engine, **kw(names))
    expected = rf"revision 0001, not {migrations.head()}.*db upgrade"
    with pytest.raises(SchemaNotReadyError, match=expected):
        await store.session("a").add_items([{"x": 1}])
    await migrations.upgrade(engine, **kw(names))
    await SessionStore(engine, **kw(names)).session("a").add_items([{"x": 1}])


async def test_unknown_newer_revision_says_upgrade_the_package(
    engine: AsyncEngine, names: TableNames
) -> None:
    """A database migrated by a newer agents_memory asks for a package upgrade, not a migration."""
    await migrations.upgrade(engine, **kw(names))
    async with engine.begin() as conn:
        await conn.execute(text(f"UPDATE {names.version_table} SET version_num = '9999'"))
    with pytest.raises(SchemaNotReadyError, match="upgrade the package"):
        await SessionStore(engine, **kw(names)).session("a").get_items()


async def test_create_tables_runs_the_migrations(engine: AsyncEngine, names: TableNames) -> None:
    """create_tables=True leaves the database at head, as the migrations would."""
    store = SessionStore(engine, create_tables=True, **kw(names))
    await store.session("a").add_items([{"x": 1}])
    assert await migrations.current(engine, **kw(names)) == migrations.head()
    assert await migrations.check(engine, **kw(names)) == []


async def test_concurrent_create_tables(file_backend: Any, names: TableNames) -> None:
    """Several engines creating the schema at once end with one schema at head."""
    engines = [create_engine(file_backend.url) for _ in range(4)]
    try:
        stores = [SessionStore(e, create_tables=True, **kw(names)) for e in engines]
        await asyncio.gather(
            *(s.session(f"s{i}").add_items([{"i": i}]) for i, s in enumerate(stores))
        )
        assert await migrations.current(engines[0], **kw(names)) == migrations.head()
        for i in range(4):
            assert await stores[0].session(f"s{i}").get_items() == [{"i": i}]
    finally:
        for e in engines:
            await e.dispose()


def test_history_is_a_chain() -> None:
    """Revisions form one line from the baseline to head, each with a description."""
    revs = migrations.history()
    assert revs[0].down_revision is None
    for older, newer in itertools.pairwise(revs):
        assert newer.down_revision == older.revision
    assert revs[-1].revision == migrations.head()
    assert all(r.message for r in revs)
    assert len(revs) >= 2


async def test_a_version_table_with_two_rows_is_refused_with_the_fix(
    engine: AsyncEngine, names: TableNames
) -> None:
    """Two revisions in one lineage's version table: a clear error, not a guess (no Alembic)."""
    from sqlalchemy import Column, MetaData, String, Table  # noqa: PLC0415

    await migrations.upgrade(engine, **kw(names))
    version = Table(names.version_table, MetaData(), Column("version_num", String(32)))
    async with engine.begin() as conn:
        await conn.execute(version.insert().values(version_num="0001"))
    with pytest.raises(SchemaNotReadyError, match="holds several revisions") as info:
        await SessionStore(engine, **kw(names)).session("a").get_items()
    assert "0001" in str(info.value)
    assert migrations.head() in str(info.value)


async def test_branch_names_round_trip_0005(engine: AsyncEngine, names: TableNames) -> None:
    """0005 drops the branches' cascade (names outlive a clear); its downgrade restores 0004.

    Down: the names of sessions that no longer exist go (0004's foreign key could not
    hold them), the others stay; up again: they are all still there, no drift.
    """
    branches = get_models(names).Branch.__table__

    async def rows() -> set[tuple[str, str]]:
        async with engine.connect() as conn:
            query = select(branches.c.session_id, branches.c.branch_id)
            return {(str(a), str(b)) for a, b in (await conn.execute(query)).all()}

    async def has_fk() -> bool:
        async with engine.connect() as conn:
            fks = await conn.run_sync(lambda c: inspect(c).get_foreign_keys(names.branches))
        return any(fk["referred_table"] == names.sessions for fk in fks)

    await migrations.upgrade(engine, **kw(names))
    assert not await has_fk()
    store = SessionStore(engine, **kw(names))
    for sid in ("live", "cleared"):
        s = store.advanced_session(sid)
        await s.add_items([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
        await s.create_branch_from_turn(2, "alt")
    await store.advanced_session("cleared").clear_session()
    assert await rows() == {("live", "alt"), ("cleared", "alt"), ("cleared", "main")}

    await migrations.downgrade(engine, revision="0004", **kw(names))
    assert await migrations.current(engine, **kw(names)) == "0004"
    assert await has_fk()
    assert await rows() == {("live", "alt")}
    await migrations.upgrade(engine, **kw(names))
    assert await rows() == {("live", "alt")}
    assert not await has_fk()
    assert await migrations.check(engine, **kw(names)) == []
    fresh = SessionStore(engine, **kw(names)).advanced_session("live")
    with pytest.raises(ValueError, match="already been used"):
        await fresh.create_branch_from_turn(1, "alt")


async def test_clear_generations_round_trip_0007(engine: AsyncEngine, names: TableNames) -> None:
    """0007 adds the clear generations (kept through a clear); its downgrade drops them."""
    generations = get_models(names).ClearGeneration.__table__

    async def tables() -> set[str]:
        async with engine.connect() as conn:
            return set(await conn.run_sync(lambda c: inspect(c).get_table_names()))

    await migrations.upgrade(engine, **kw(names))
    store = SessionStore(engine, **kw(names))
    s = store.advanced_session("cleared")
    await s.add_items([{"role": "user", "content": "a"}])
    await s.clear_session()
    async with engine.connect() as conn:
        query = select(generations.c.session_id, generations.c.generation)
        rows = (await conn.execute(query)).all()
    assert [tuple(r) for r in rows] == [("cleared", 1)]

    await migrations.downgrade(engine, revision="0006", **kw(names))
    assert await migrations.current(engine, **kw(names)) == "0006"
    assert names.clear_generations not in await tables()
    await migrations.upgrade(engine, **kw(names))
    assert names.clear_generations in await tables()
    assert await migrations.check(engine, **kw(names)) == []
