"""Databases written by the seed, by the Agents SDK or by an unversioned store upgrade in place."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import agents
import pytest
from agents.extensions import memory
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory import SessionStore, TableNames, create_engine, migrations

ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": "hello ünïcode 😀"},
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    {"role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
]


def kw(names: TableNames) -> dict[str, str]:
    return {"sessions_table": names.sessions, "messages_table": names.messages}


def write_seed_database(path: Path, names: TableNames) -> None:
    """The seed's SQLiteSession schema and writes, as its interface text defines them."""
    import json  # noqa: PLC0415

    conn = sqlite3.connect(path)
    conn.executescript(
        f"""
        CREATE TABLE {names.sessions} (
            session_id TEXT PRIMARY KEY,
            created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
            updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP
        );
        CREATE TABLE {names.messages} (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            session_id TEXT NOT NULL,
            message_data TEXT NOT NULL,
            created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
            FOREIGN KEY (session_id) REFERENCES {names.sessions} (session_id) ON DELETE CASCADE
        );
        CREATE INDEX idx_{names.messages}_session_id ON {names.messages} (session_id, id);
        """
    )
    for sid in ("s1", "s2"):
        conn.execute(f"INSERT OR IGNORE INTO {names.sessions} (session_id) VALUES (?)", (sid,))
        conn.executemany(
            f"INSERT INTO {names.messages} (session_id, message_data) VALUES (?, ?)",
            [(sid, json.dumps(i)) for i in ITEMS],
        )
    conn.commit()
    conn.close()


async def assert_upgraded_intact(engine: AsyncEngine, names: TableNames, sids: list[str]) -> None:
    """Read before and after the upgrade: same items, same order; no drift; still writable."""
    assert await migrations.current(engine, **kw(names)) is None
    await migrations.upgrade(engine, **kw(names))
    assert await migrations.current(engine, **kw(names)) == migrations.head()
    assert await migrations.check(engine, **kw(names)) == []
    store = SessionStore(engine, **kw(names))
    for sid in sids:
        assert await store.session(sid).get_items() == ITEMS
    await store.session(sids[0]).add_items([{"role": "user", "content": "after"}])
    assert (await store.session(sids[0]).get_items())[-1] == {"role": "user", "content": "after"}
    assert await store.session(sids[0]).pop_item() == {"role": "user", "content": "after"}
    await store.session(sids[1]).clear_session()
    assert await store.session(sids[1]).get_items() == []
    assert await store.session(sids[0]).get_items() == ITEMS


async def test_seed_sqlite_database_is_read_then_upgraded(
    tmp_path: Path, names: TableNames
) -> None:
    """A file written by the seed's SQLiteSession is read as it is, then migrated losing nothing."""
    path = tmp_path / "seed.db"
    write_seed_database(path, names)
    engine = create_engine(f"sqlite:///{path}")
    try:
        # read as it is, before any migration (the schema is the seed's)
        async with engine.connect() as conn:
            count = (await conn.execute(text(f"SELECT count(*) FROM {names.messages}"))).scalar()
        assert count == 2 * len(ITEMS)
        await assert_upgraded_intact(engine, names, ["s1", "s2"])
    finally:
        await engine.dispose()


async def test_agents_sdk_sqlite_session_database(tmp_path: Path, names: TableNames) -> None:
    """A file written by the Agents SDK's stdlib SQLiteSession upgrades in place."""
    path = tmp_path / "sdk.db"
    for sid in ("s1", "s2"):
        sdk = agents.SQLiteSession(
            sid, path, sessions_table=names.sessions, messages_table=names.messages
        )
        await sdk.add_items(ITEMS)
        sdk.close()
    engine = create_engine(f"sqlite:///{path}")
    try:
        await assert_upgraded_intact(engine, names, ["s1", "s2"])
    finally:
        await engine.dispose()


async def test_agents_sdk_sqlalchemy_session_database(
    file_backend: Any, engine: AsyncEngine, names: TableNames
) -> None:
    """Tables made by the Agents SDK's SQLAlchemySession (index on created_at) upgrade in place."""
    if file_backend.kind == "mysql":
        pytest.skip("the Agents SDK's SQLAlchemySession cannot create tables on MySQL/MariaDB")
    for sid in ("s1", "s2"):
        sdk = memory.SQLAlchemySession(sid, engine=engine, create_tables=True, **kw(names))
        await sdk.add_items(ITEMS)
    await assert_upgraded_intact(engine, names, ["s1", "s2"])
    async with engine.connect() as conn:
        indexes = await conn.run_sync(
            lambda c: __import__("sqlalchemy").inspect(c).get_indexes(names.messages)
        )
    assert [i["column_names"] for i in indexes] == []  # (0006: the key is (session_id, position))


async def test_unversioned_baseline_tables(engine: AsyncEngine, names: TableNames) -> None:
    """Tables in the baseline shape but without a version table (early create_tables) adopt."""
    await migrations.upgrade(engine, revision="0001", **kw(names))
    async with engine.begin() as conn:
        await conn.execute(text(f"DROP TABLE {names.version_table}"))
        await conn.execute(text(f"INSERT INTO {names.sessions} (session_id) VALUES ('s1'), ('s2')"))
        for sid in ("s1", "s2"):
            for item in ITEMS:
                await conn.execute(
                    text(
                        f"INSERT INTO {names.messages} (session_id, message_data) VALUES (:s, :d)"
                    ),
                    {"s": sid, "d": __import__("json").dumps(item)},
                )
    await assert_upgraded_intact(engine, names, ["s1", "s2"])


async def test_unmigrated_seed_and_sdk_tables_are_read_as_they_are(
    file_backend: Any, engine: AsyncEngine, names: TableNames, caplog: pytest.LogCaptureFixture
) -> None:
    """Without migrating, our session reads and writes tables the Agents SDK created."""
    if file_backend.kind == "mysql":
        pytest.skip("the Agents SDK's SQLAlchemySession cannot create tables on MySQL/MariaDB")
    sdk = memory.SQLAlchemySession("s1", engine=engine, create_tables=True, **kw(names))
    await sdk.add_items(ITEMS)
    store = SessionStore(engine, **kw(names))
    with caplog.at_level("WARNING", logger="agents_memory"):
        assert await store.session("s1").get_items() == ITEMS
    assert "created without migrations" in caplog.text
    assert "agents-memory db upgrade" in caplog.text
    await store.session("s1").add_items([{"role": "user", "content": "ours"}])
    assert (await sdk.get_items())[-1] == {"role": "user", "content": "ours"}
    assert await store.session("s1").pop_item() == {"role": "user", "content": "ours"}
    assert await migrations.current(engine, **kw(names)) is None  # nothing was migrated
