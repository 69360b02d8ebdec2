"""MySQL/MariaDB specifics of the migrations: the named lock, and adopting hand-made tables."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from sqlalchemy import inspect, text
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory import SessionStore, TableNames, migrations
from agents_memory._databases import mysql as mysql_module
from agents_memory._migrations import _runner

ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": "hello ünïcode 😀"},
    {"role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
]


def kw(names: TableNames) -> dict[str, str]:
    return {"sessions_table": names.sessions, "messages_table": names.messages}


@pytest.fixture
def mysql_engine(backend: Any, engine: AsyncEngine) -> AsyncEngine:
    """The engine, on MySQL/MariaDB only."""
    if backend.kind != "mysql":
        pytest.skip("MySQL/MariaDB only")
    return engine


def lock_name(names: TableNames) -> str:
    return f"agents_memory:{_runner._lock_key(names) & 0xFFFFFFFFFFFFFFFF:016x}"


async def test_migration_lock_is_released(mysql_engine: AsyncEngine, names: TableNames) -> None:
    """The GET_LOCK a migration takes is free again afterwards, on a pooled connection too."""
    await migrations.upgrade(mysql_engine, **kw(names))
    await migrations.downgrade(mysql_engine, revision="0001", **kw(names))
    async with mysql_engine.connect() as conn:
        free = await conn.execute(text("SELECT IS_FREE_LOCK(:n)"), {"n": lock_name(names)})
        assert free.scalar() == 1


async def test_held_lock_makes_a_migrator_wait_then_fail(
    mysql_engine: AsyncEngine, names: TableNames, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A migrator waits on another's lock, then fails clearly past the timeout, creating nothing."""
    monkeypatch.setattr(mysql_module, "MIGRATION_LOCK_TIMEOUT_S", 1)
    async with mysql_engine.connect() as holder:
        got = await holder.execute(text("SELECT GET_LOCK(:n, 0)"), {"n": lock_name(names)})
        assert got.scalar() == 1
        with pytest.raises(RuntimeError, match="held its lock"):
            await migrations.upgrade(mysql_engine, **kw(names))
        await holder.execute(text("SELECT RELEASE_LOCK(:n)"), {"n": lock_name(names)})
    assert await migrations.current(mysql_engine, **kw(names)) is None
    await migrations.upgrade(mysql_engine, **kw(names))
    assert await migrations.check(mysql_engine, **kw(names)) == []


async def test_sdk_shaped_tables_made_by_hand_adopt(
    mysql_engine: AsyncEngine, names: TableNames
) -> None:
    """Hand-made tables shaped like the Agents SDK's upgrade in place, ids and rows kept.

    INT ids, TEXT, second-precision TIMESTAMPs, a case-insensitive collation and
    the SDK's session_time index: the SDK itself cannot create them on MySQL.
    """
    s, m = names.sessions, names.messages
    async with mysql_engine.begin() as conn:
        await conn.execute(
            text(
                f"CREATE TABLE {s} (session_id VARCHAR(255) NOT NULL PRIMARY KEY, "
                "created_at TIMESTAMP NULL DEFAULT CURRENT_TIMESTAMP, "
                "updated_at TIMESTAMP NULL DEFAULT CURRENT_TIMESTAMP) "
                "CHARSET utf8mb4 COLLATE utf8mb4_general_ci"
            )
        )
        await conn.execute(
            text(
                f"CREATE TABLE {m} (id INT NOT NULL AUTO_INCREMENT PRIMARY KEY, "
                "session_id VARCHAR(255) NOT NULL, message_data TEXT, "
                "created_at TIMESTAMP NULL DEFAULT CURRENT_TIMESTAMP, "
                f"INDEX idx_{m}_session_time (session_id, created_at), "
                f"FOREIGN KEY (session_id) REFERENCES {s} (session_id) ON DELETE CASCADE) "
                "CHARSET utf8mb4 COLLATE utf8mb4_general_ci"
            )
        )
        await conn.execute(text(f"INSERT INTO {s} (session_id) VALUES ('s1'), ('s2')"))
        for sid in ("s1", "s2"):
            for item in ITEMS:
                await conn.execute(
                    text(f"INSERT INTO {m} (session_id, message_data) VALUES (:s, :d)"),
                    {"s": sid, "d": json.dumps(item, ensure_ascii=False)},
                )
        ids_before = (await conn.execute(text(f"SELECT id FROM {m} ORDER BY id"))).scalars().all()

    # adoption is 0001's: its ids and AUTO_INCREMENT are there at 0005, the last with ids
    await migrations.upgrade(mysql_engine, revision="0005", **kw(names))
    async with mysql_engine.begin() as conn:
        ids_after = (await conn.execute(text(f"SELECT id FROM {m} ORDER BY id"))).scalars().all()
        assert ids_after == ids_before
        await conn.execute(text(f"INSERT INTO {m} (session_id, message_data) VALUES ('s2', 'x')"))
        (added,) = (await conn.execute(text(f"SELECT id FROM {m} WHERE message_data = 'x'"))).one()
        assert added > max(ids_before)  # AUTO_INCREMENT survived the column change
        indexes = await conn.run_sync(lambda c: inspect(c).get_indexes(m))
        assert [i["column_names"] for i in indexes] == [["session_id", "id"]]
        await conn.execute(text(f"DELETE FROM {m} WHERE message_data = 'x'"))

    await migrations.upgrade(mysql_engine, **kw(names))
    assert await migrations.check(mysql_engine, **kw(names)) == []
    store = SessionStore(mysql_engine, **kw(names))
    for sid in ("s1", "s2"):
        assert await store.session(sid).get_items() == ITEMS
    await store.session("S1").add_items([{"big": "😀" * 100_000}])  # distinct from s1 now
    assert await store.session("s1").get_items() == ITEMS
    assert await store.session("s1").pop_item() == ITEMS[-1]
    await store.session("s2").clear_session()
    assert await store.session("s2").get_items() == []
    async with mysql_engine.connect() as conn:
        indexes = await conn.run_sync(lambda c: inspect(c).get_indexes(m))
    assert indexes == []  # the key (session_id, position) serves reads and the foreign key


async def test_check_sees_lost_size_or_precision(
    mysql_engine: AsyncEngine, names: TableNames
) -> None:
    """check() reports TEXT for LONGTEXT and DATETIME for DATETIME(6), which would lose data."""
    await migrations.upgrade(mysql_engine, **kw(names))
    assert await migrations.check(mysql_engine, **kw(names)) == []
    async with mysql_engine.begin() as conn:
        await conn.execute(text(f"ALTER TABLE {names.messages} MODIFY message_data TEXT NOT NULL"))
        await conn.execute(
            text(
                f"ALTER TABLE {names.sessions} MODIFY updated_at DATETIME NOT NULL "
                "DEFAULT CURRENT_TIMESTAMP"
            )
        )
    problems = await migrations.check(mysql_engine, **kw(names))
    assert len(problems) == 2
    assert any("message_data" in p for p in problems)
    assert any("updated_at" in p for p in problems)


async def test_primary_key_name_notes_stay_off_stderr(
    mysql_engine: AsyncEngine, names: TableNames, caplog: pytest.LogCaptureFixture
) -> None:
    """MariaDB's "name ignored for PRIMARY key" notes are not logged; other warnings still are."""
    caplog.set_level(logging.WARNING, logger="asyncmy")
    await migrations.upgrade(mysql_engine, **kw(names))
    assert await migrations.current(mysql_engine, **kw(names)) == migrations.head()
    assert not [r for r in caplog.records if "PRIMARY key" in r.getMessage()]
    async with mysql_engine.connect() as conn:  # outside a migration, notes still come through
        await conn.execute(text("DROP TABLE IF EXISTS agents_memory_no_such_table"))
    assert any("agents_memory_no_such_table" in r.getMessage() for r in caplog.records)
