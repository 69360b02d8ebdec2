"""Wrong or swapped table names: nothing is changed, and the message says what exists."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, inspect
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.schema import DropIndex, DropTable

from agents_memory import SchemaNotReadyError, SessionStore, TableNames, migrations
from agents_memory._migrations._preflight import TableMismatchError


def kw(names: TableNames) -> dict[str, str]:
    return {"sessions_table": names.sessions, "messages_table": names.messages}


async def schema_of(engine: AsyncEngine, names: TableNames) -> dict[str, list[tuple[str, str]]]:
    """The test's tables (both name orders' version tables too) and their columns and types.

    Only these: other tests on a shared server create and drop tables meanwhile.
    """
    swapped = TableNames(names.messages, names.sessions)
    mine = (names.sessions, names.messages, names.version_table, swapped.version_table)

    def read(conn: Any) -> dict[str, list[tuple[str, str]]]:
        insp = inspect(conn)
        return {
            t: [(c["name"], str(c["type"])) for c in insp.get_columns(t)]
            for t in mine
            if insp.has_table(t)
        }

    async with engine.connect() as conn:
        return await conn.run_sync(read)


async def test_swapped_names_change_nothing_and_say_so(
    engine: AsyncEngine, names: TableNames
) -> None:
    """Upgrade and check with swapped names: the same error, the fix named, the schema unchanged."""
    swapped = TableNames(names.messages, names.sessions)
    try:
        store = SessionStore(engine, create_tables=True, **kw(names))
        await store.session("kept").add_items([{"n": 1}])
        before = await schema_of(engine, names)
        with pytest.raises(TableMismatchError) as upgrading:
            await migrations.upgrade(engine, **kw(swapped))
        message = str(upgrading.value)
        assert f"{names.messages}, given as the sessions table, is a messages table" in message
        assert f"{names.sessions}, given as the messages table, is a sessions table" in message
        assert f"use --sessions-table {names.sessions} --messages-table {names.messages}" in message
        assert "nothing was changed" in message
        assert await schema_of(engine, names) == before  # no column added, no version table left
        with pytest.raises(TableMismatchError) as checking:
            await migrations.check(engine, **kw(swapped))
        # check and upgrade say the same thing (other runs' sets on a shared server may differ)
        assert (
            str(checking.value).split("table-name sets")[0]
            == message.split("table-name sets", maxsplit=1)[0]
        )
        with pytest.raises(TableMismatchError):  # and using the store says it too
            await SessionStore(engine, **kw(swapped)).session("kept").get_items()
        assert await store.session("kept").get_items() == [{"n": 1}]
    finally:
        async with engine.begin() as conn:
            await conn.execute(DropTable(Table(swapped.version_table, MetaData()), if_exists=True))


async def test_a_table_of_another_shape_is_named_with_its_columns(
    engine: AsyncEngine, names: TableNames
) -> None:
    """An application's own table given as our sessions table: refused, its columns listed."""
    app = Table(
        names.sessions,
        MetaData(),
        Column("id", Integer, primary_key=True),
        Column("email", String(100)),
    )
    async with engine.begin() as conn:
        await conn.run_sync(app.create)
    before = await schema_of(engine, names)
    with pytest.raises(TableMismatchError) as info:
        await migrations.upgrade(engine, **kw(names))
    assert (
        f"{names.sessions}, given as the sessions table, is not an agents_memory table "
        "(its columns: email, id)"
    ) in str(info.value)
    assert await schema_of(engine, names) == before


async def test_a_misspelled_name_lists_the_sets_that_exist(
    engine: AsyncEngine, names: TableNames
) -> None:
    """A typo in a table name: the error lists the existing table-name sets; nothing is created."""
    store = SessionStore(engine, create_tables=True, **kw(names))
    await store.session("a").add_items([{"n": 1}])
    typo = TableNames(names.sessions + "x", names.messages + "x")
    with pytest.raises(SchemaNotReadyError) as info:
        await SessionStore(engine, **kw(typo)).session("a").get_items()
    message = str(info.value)
    assert f"table-name sets that exist there: {names.sessions}/{names.messages}" in message
    assert "Check --sessions-table/--messages-table" in message
    async with engine.connect() as conn:
        made = await conn.run_sync(
            lambda c: [t for t in (typo.sessions, typo.messages) if inspect(c).has_table(t)]
        )
    assert made == []


async def test_check_describes_drift_in_sentences(engine: AsyncEngine, names: TableNames) -> None:
    """`check` names a missing index and an extra column in words, never a Python repr."""
    store = SessionStore(engine, create_tables=True, **kw(names))
    await store.session("a").add_items([{"n": 1}])
    models = TableNames(names.sessions, names.messages)

    def drift(conn: Any) -> None:
        insp = inspect(conn)
        [index] = [
            i for i in insp.get_indexes(models.sessions) if i["column_names"] == ["updated_at"]
        ]
        conn.execute(DropIndex(_index(index["name"], models.sessions)))

    async with engine.begin() as conn:
        await conn.run_sync(drift)
    differences = await migrations.check(engine, **kw(names))
    assert differences, "a dropped index is a difference"
    text = "\n".join(differences)
    assert f"on {names.sessions} (updated_at) is missing" in text
    assert "Column(" not in text
    assert "0x" not in text
    assert "(" + "'add_index'" not in text
    await migrations.upgrade(engine, **kw(names))  # upgrade does not fix drift at head...
    assert await migrations.check(engine, **kw(names)) == differences  # ...and check agrees


def _index(name: str, table: str) -> Any:
    from sqlalchemy import Index  # noqa: PLC0415

    t = Table(table, MetaData(), Column("updated_at", String(10)))
    return Index(name, t.c.updated_at)
