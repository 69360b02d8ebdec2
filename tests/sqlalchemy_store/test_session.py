"""The Session contract of SQLAlchemySession, on every backend."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from sqlalchemy import text

from agents_memory import (
    Session,
    SessionClosedError,
    SessionSettings,
    SessionStore,
    SQLAlchemySession,
    TableNames,
)


def msg(i: int, role: str = "user") -> dict[str, Any]:
    return {"role": role, "content": f"message {i}", "type": "message"}


async def test_is_a_session(store: SessionStore) -> None:
    """It satisfies the runtime-checkable protocol the Agents SDK checks."""
    assert isinstance(store.session("s"), Session)


async def test_round_trip_in_order(store: SessionStore) -> None:
    """Items come back exactly as stored, in insertion order, across batches."""
    s = store.session("conv")
    items = [
        msg(0),
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "ünïcødé ✓ 😀 中文"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "x" * 5000}]},
        {"nested": {"list": [1, 2.5, True, None, {"k": "v"}]}, "empty": {}, "e": []},
    ]
    await s.add_items(items[:2])
    await s.add_items(items[2:])
    assert await s.get_items() == items


async def test_limit_returns_latest_in_order(store: SessionStore) -> None:
    """get_items(limit=N) is the latest N, oldest first; 0 is []; too large is all."""
    s = store.session("conv")
    items = [msg(i) for i in range(10)]
    await s.add_items(items)
    assert await s.get_items(limit=3) == items[-3:]
    assert await s.get_items(limit=1) == items[-1:]
    assert await s.get_items(limit=0) == []
    assert await s.get_items(limit=100) == items


async def test_settings_limit_and_override(store: SessionStore) -> None:
    """Without a limit, session_settings.limit applies; an explicit limit overrides it."""
    s = store.session("conv", session_settings=SessionSettings(limit=2))
    items = [msg(i) for i in range(5)]
    await s.add_items(items)
    assert await s.get_items() == items[-2:]
    assert await s.get_items(limit=4) == items[-4:]
    assert await s.get_items(limit=0) == []


async def test_negative_limit_is_rejected(store: SessionStore) -> None:
    """A negative or non-int limit is a clear error, not a silent full read."""
    s = store.session("conv")
    with pytest.raises(ValueError, match="limit"):
        await s.get_items(limit=-1)
    with pytest.raises(TypeError, match="limit"):
        await s.get_items(limit="3")  # type: ignore[arg-type]


async def test_empty_session(store: SessionStore) -> None:
    """A session never written to reads empty and pops None."""
    s = store.session("nobody")
    assert await s.get_items() == []
    assert await s.get_items(limit=5) == []
    assert await s.pop_item() is None


async def test_pop_newest_until_empty(store: SessionStore) -> None:
    """pop_item removes and returns the newest item each time, then None."""
    s = store.session("conv")
    items = [msg(i) for i in range(3)]
    await s.add_items(items)
    assert await s.pop_item() == items[2]
    assert await s.get_items() == items[:2]
    assert await s.pop_item() == items[1]
    assert await s.pop_item() == items[0]
    assert await s.pop_item() is None
    await s.add_items([msg(9)])
    assert await s.get_items() == [msg(9)]


async def test_clear_removes_session_and_items(store: SessionStore) -> None:
    """clear_session deletes the session row and all its items, leaving others alone."""
    a, b = store.session("a"), store.session("b")
    await a.add_items([msg(1), msg(2)])
    await b.add_items([msg(3)])
    await a.clear_session()
    assert await a.get_items() == []
    assert await store.get_session("a") is None
    assert await b.get_items() == [msg(3)]
    await a.clear_session()  # clearing an absent session is fine
    await a.add_items([msg(4)])
    assert await a.get_items() == [msg(4)]


async def test_add_nothing_does_nothing(store: SessionStore) -> None:
    """add_items([]) writes no session row."""
    s = store.session("conv")
    await s.add_items([])
    assert await store.get_session("conv") is None


async def test_sessions_are_isolated(store: SessionStore) -> None:
    """Items of one session never appear in another."""
    a, b = store.session("a"), store.session("b")
    await a.add_items([msg(1)])
    await b.add_items([msg(2)])
    await a.add_items([msg(3)])
    assert await a.get_items() == [msg(1), msg(3)]
    assert await b.get_items() == [msg(2)]
    assert await b.pop_item() == msg(2)
    assert await a.get_items() == [msg(1), msg(3)]


@pytest.mark.parametrize(
    "bad",
    [
        [msg(1), object()],
        [msg(1), None],
        [msg(1), {"x": object()}],
        [msg(1), "not a dict"],
        [msg(1), {1: "int key"}],
        [msg(1), {"v": float("nan")}],
        [msg(1), {"v": float("inf")}],
    ],
)
async def test_bad_item_rejects_whole_batch(store: SessionStore, bad: list[Any]) -> None:
    """A bad item raises a typed error before anything of its batch is written."""
    s = store.session("conv")
    await s.add_items([msg(0)])
    with pytest.raises((TypeError, ValueError)):
        await s.add_items(bad)
    assert await s.get_items() == [msg(0)]


async def test_items_must_be_a_list(store: SessionStore) -> None:
    """A dict or string passed as the batch is a TypeError, not a list of its keys."""
    s = store.session("conv")
    with pytest.raises(TypeError):
        await s.add_items(msg(1))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await s.add_items("abc")  # type: ignore[arg-type]
    assert await s.get_items() == []


async def test_awkward_text_round_trips(store: SessionStore) -> None:
    """NUL characters, lone surrogates, quotes and SQL in text round-trip exactly."""
    s = store.session("conv")
    items = [
        {"content": "nul \x00 inside"},
        {"content": "lone \ud800 surrogate"},
        {"content": "'; DROP TABLE x; --\" \\ \n\t"},
    ]
    await s.add_items(items)
    assert await s.get_items() == items


@pytest.mark.parametrize(
    ("session_id", "error"),
    [("", ValueError), (None, TypeError), (42, TypeError), ("x" * 256, ValueError)],
)
async def test_bad_session_id(store: SessionStore, session_id: Any, error: type) -> None:
    """An empty, overlong or non-string session id is refused up front."""
    with pytest.raises(error):
        store.session(session_id)


async def test_hostile_session_ids_round_trip(store: SessionStore) -> None:
    """Ids with quotes, SQL and unicode are plain data: stored and found exactly."""
    ids = ["'; DROP TABLE agent_sessions; --", 'a"b', "ユーザー-1 😀", "x" * 255]
    for i, sid in enumerate(ids):
        await store.session(sid).add_items([msg(i)])
    for i, sid in enumerate(ids):
        assert await store.session(sid).get_items() == [msg(i)]


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
    names = store.table_names
    async with store.engine.begin() as conn:
        await conn.execute(
            text(f"INSERT INTO {names.messages} (session_id, message_data) VALUES (:s, :d)"),
            {"s": session_id, "d": data},
        )


async def test_corrupt_rows_are_skipped(
    store: SessionStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Invalid JSON rows are skipped with a warning, and limit still counts valid items."""
    s = store.session("conv")
    await s.add_items([msg(0), msg(1)])
    await _insert_raw(store, "conv", "{not json")
    await s.add_items([msg(2)])
    await _insert_raw(store, "conv", '"a string, not an object"')
    with caplog.at_level(logging.WARNING, logger="agents_memory"):
        assert await s.get_items() == [msg(0), msg(1), msg(2)]
        assert await s.get_items(limit=2) == [msg(1), msg(2)]
        assert await s.get_items(limit=3) == [msg(0), msg(1), msg(2)]
    assert "not valid JSON" in caplog.text
    assert await s.pop_item() == msg(2)
    assert await s.get_items() == [msg(0), msg(1)]


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
