"""The Session contract of SQLAlchemySession, on every backend, and what only it has."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import raw_rows
from session_contract import SessionContract, msg
from sqlalchemy import event, text

from agents_memory import (
    SessionClosedError,
    SessionSettings,
    SessionStore,
    SQLAlchemySession,
    TableNames,
)
from agents_memory._codec import encode_items
from agents_memory._databases.base import observed


class StoreHarness:
    """The contract's view of a SessionStore on the backend under test."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store

    def session(
        self, session_id: str, *, session_settings: SessionSettings | None = None
    ) -> SQLAlchemySession:
        """A session of the store."""
        return self.store.session(session_id, session_settings=session_settings)

    async def exists(self, session_id: str) -> bool:
        """Whether the store lists the session."""
        return await self.store.get_session(session_id) is not None

    async def insert_raw(self, session_id: str, data: str) -> None:
        """Insert a row with SQL, bypassing the session."""
        await _insert_raw(self.store, session_id, data)


def _observe(_conn: Any, _cursor: Any, _statement: str, *_: Any) -> None:
    """An execution listener: the engine is observed, so its statements go through SQLAlchemy."""


class TestSQLAlchemySessionContract(SessionContract):
    """The shared Session contract, for sessions of a SessionStore on every backend.

    Twice per backend: on the database's driver runner, and on the SQLAlchemy
    runner (what an engine with ``echo`` or execution events gets).
    """

    @pytest.fixture(params=["driver", "sqlalchemy"])
    def harness(
        self, request: pytest.FixtureRequest, store: SessionStore
    ) -> Iterator[StoreHarness]:
        """The backend's store, seen through the contract's harness, on one runner."""
        core = request.param == "sqlalchemy"
        if core:
            event.listen(store.engine.sync_engine, "before_cursor_execute", _observe)
        assert observed(store.engine) == core
        yield StoreHarness(store)
        if core:
            event.remove(store.engine.sync_engine, "before_cursor_execute", _observe)


@pytest.mark.parametrize("name", ["bad-name", "1abc", "a b", "x;drop", "", "a" * 64, "ü"])
async def test_bad_table_names(engine: Any, name: str) -> None:
    """Table names must be SQL identifiers of at most 63 characters."""
    with pytest.raises(ValueError, match="table name"):
        SQLAlchemySession("s", engine=engine, sessions_table=name)
    with pytest.raises(ValueError, match="table name"):
        SessionStore(engine, messages_table=name)


async def test_table_names_must_be_strings(engine: Any) -> None:
    """A non-string table name is a TypeError."""
    with pytest.raises(TypeError):
        SQLAlchemySession("s", engine=engine, sessions_table=3)  # type: ignore[arg-type]


async def _insert_raw(store: SessionStore, session_id: str, data: str) -> None:
    """Write a message row behind the library's back (as a broken writer would)."""
    await raw_rows.insert_raw(store.engine, store.table_names, session_id, data)


async def test_from_url_owns_and_closes_engine(backend: Any, names: TableNames) -> None:
    """from_url makes a working session; close() disposes it and later calls raise."""
    session = SQLAlchemySession.from_url(
        "owned",
        url=backend.url,
        create_tables=True,
        sessions_table=names.sessions,
        messages_table=names.messages,
    )
    try:
        await session.add_items([msg(1)])
        assert await session.get_items() == [msg(1)]
        assert session.engine.dialect.name in ("sqlite", "postgresql", "mysql", "mariadb")
    finally:
        await session.clear_session()
        await session.close()
    with pytest.raises(SessionClosedError):
        await session.get_items()


async def test_close_leaves_a_shared_engine_open(store: SessionStore) -> None:
    """Closing a session from a store or over a passed engine does not close the engine."""
    first = store.session("a")
    await first.add_items([msg(1)])
    await first.close()
    with pytest.raises(SessionClosedError):
        await first.add_items([msg(2)])
    assert await store.session("a").get_items() == [msg(1)]
    own = SQLAlchemySession(
        "a",
        engine=store.engine,
        sessions_table=store.table_names.sessions,
        messages_table=store.table_names.messages,
    )
    async with own:
        assert await own.get_items() == [msg(1)]
    assert await store.session("a").get_items() == [msg(1)]


async def test_iter_items_streams_in_batches(store: SessionStore) -> None:
    """iter_items yields every item oldest first, across batch boundaries."""
    s = store.session("conv")
    items = [msg(i) for i in range(23)]
    await s.add_items(items)
    assert [i async for i in s.iter_items(batch_size=5)] == items
    assert [i async for i in s.iter_items(batch_size=23)] == items
    assert [i async for i in store.session("none").iter_items()] == []
    with pytest.raises(ValueError, match="batch_size"):
        _ = [i async for i in s.iter_items(batch_size=0)]


async def test_large_items_round_trip(store: SessionStore) -> None:
    """Items far past 64 KiB (MySQL's TEXT limit) and 4-byte characters come back whole."""
    s = store.session("big")
    items = [
        {"content": "😀" * 300_000},  # 1.2 MB of UTF-8
        {"content": "ü" * 100_000, "n": 1},
        {"content": "x" * 70_000, "emoji": "👩‍👩‍👧"},
    ]
    await s.add_items(items)
    assert await s.get_items() == items
    assert await s.get_items(limit=1) == items[-1:]
    assert await s.pop_item() == items[-1]
    assert [i async for i in s.iter_items(batch_size=1)] == items[:2]


async def test_ids_differing_in_case_accent_or_trailing_space_are_distinct(
    store: SessionStore,
) -> None:
    """Session ids are compared exactly: no case folding, accent folding or space padding."""
    ids = ["abc", "ABC", "abc ", "ábc", "a\u0301bc", "abc\t"]
    for i, sid in enumerate(ids):
        await store.session(sid).add_items([msg(i)])
    for i, sid in enumerate(ids):
        assert await store.session(sid).get_items() == [msg(i)]
        assert (await store.get_session(sid)) is not None
    listed = (await store.list_sessions()).sessions
    assert sorted(i.session_id for i in listed) == sorted(ids)
    await store.session("abc").clear_session()
    assert await store.session("abc ").get_items() == [msg(2)]


async def test_item_past_mysql_packet_limit_is_a_clear_error(
    backend: Any, store: SessionStore
) -> None:
    """On MySQL, an item past max_allowed_packet is a ValueError naming it; nothing is written."""
    if backend.kind != "mysql":
        pytest.skip("MySQL/MariaDB only")
    async with store.engine.connect() as conn:
        limit = int((await conn.execute(text("SELECT @@max_allowed_packet"))).scalar_one())
    if limit > 64 * 2**20:
        pytest.skip(f"max_allowed_packet is {limit}: too large an item to build in a test")
    s = store.session("big")
    await s.add_items([msg(0)])
    with pytest.raises(ValueError, match="max_allowed_packet"):
        await s.add_items([msg(1), {"content": "y" * limit}])
    with pytest.raises(ValueError, match="max_allowed_packet"):
        await s.add_items([{"content": '"' * (limit // 2)}])  # escaped, it doubles
    assert await s.get_items() == [msg(0)]
    await s.add_items([{"content": "😀" * (limit // 16)}])  # large, but fits
    assert len(await s.get_items()) == 2


async def _stored_text(engine: Any, names: TableNames, session_id: str) -> list[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                f"SELECT message_data FROM {names.messages} WHERE session_id = :s ORDER BY position"
            ),
            {"s": session_id},
        )
        return [row[0] for row in rows]


async def test_ensure_ascii_means_what_it_means_in_the_sdk(engine: Any, names: TableNames) -> None:
    """ensure_ascii=True stores non-ASCII text escaped (the SDK's default); False stores it as is.

    Either way the item reads back the same; a store passes its choice to its sessions.
    """
    item = {"role": "user", "content": "Café ☔ 中文"}
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    escaped = SQLAlchemySession("esc", engine=engine, create_tables=True, ensure_ascii=True, **kw)
    plain = SQLAlchemySession("plain", engine=engine, create_tables=True, **kw)
    await escaped.add_items([item])
    await plain.add_items([item])
    assert await escaped.get_items() == [item]
    assert await plain.get_items() == [item]
    assert await _stored_text(engine, names, "esc") == [
        '{"role":"user","content":"Caf\\u00e9 \\u2614 \\u4e2d\\u6587"}'
    ]
    [plain_text] = await _stored_text(engine, names, "plain")
    assert plain_text == encode_items([item])[0]  # (as is; orjson's text ends with its mark)
    assert plain_text.rstrip() == '{"role":"user","content":"Café ☔ 中文"}'
    store = SessionStore(engine, ensure_ascii=True, **kw)
    await store.session("store").add_items([item])
    assert "\\u00e9" in (await _stored_text(engine, names, "store"))[0]


async def test_settings_given_to_the_store_are_coerced(engine: Any, names: TableNames) -> None:
    """SessionStore(session_settings={...}) holds the SDK's settings and its sessions share them."""
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    store = SessionStore(engine, create_tables=True, session_settings={"limit": 1}, **kw)
    assert store.session_settings == SessionSettings(limit=1)
    s = store.session("s")
    assert s.session_settings is store.session_settings
    await s.add_items([msg(0), msg(1)])
    assert await s.get_items() == [msg(1)]
    assert store.session("s", session_settings={"limit": 2}).session_settings == SessionSettings(
        limit=2
    )
    with pytest.raises(TypeError, match="Unknown session settings: limitt"):
        SessionStore(engine, session_settings={"limitt": 1}, **kw)
