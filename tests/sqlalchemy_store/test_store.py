"""SessionStore: one pool for many sessions, listing by keyset, deletion."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory import SessionStore, migrations


async def test_sessions_share_one_pool(store: SessionStore) -> None:
    """Every session a store hands out runs on the store's one engine."""
    a, b = store.session("a"), store.session("b")
    assert a.engine is b.engine is store.engine


async def test_list_newest_updated_first_with_counts(store: SessionStore) -> None:
    """Listing orders by last update, newest first, with item counts and times."""
    for sid, n in (("old", 1), ("mid", 2), ("new", 3)):
        await store.session(sid).add_items([{"i": i} for i in range(n)])
        await asyncio.sleep(0.002)  # times are kept to the microsecond on every database
    page = await store.list_sessions()
    assert [(i.session_id, i.item_count) for i in page.sessions] == [
        ("new", 3),
        ("mid", 2),
        ("old", 1),
    ]
    assert page.next_cursor is None
    assert all(i.created_at <= i.updated_at for i in page.sessions)
    # writing to "old" makes it the most recently updated
    await store.session("old").add_items([{"i": 9}])
    page = await store.list_sessions()
    assert page.sessions[0].session_id == "old"
    assert page.sessions[0].item_count == 2


async def test_keyset_pagination_visits_each_session_once(store: SessionStore) -> None:
    """Paging with next_cursor returns every session exactly once, in listing order."""
    ids = [f"s{i:02d}" for i in range(23)]
    await asyncio.gather(*(store.session(sid).add_items([{"x": 1}]) for sid in ids))
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = await store.list_sessions(limit=5, cursor=cursor)
        pages += 1
        assert len(page.sessions) <= 5
        seen += [i.session_id for i in page.sessions]
        cursor = page.next_cursor
        if cursor is None:
            break
    assert sorted(seen) == ids
    assert len(seen) == len(set(seen))
    assert pages == 5
    full = await store.list_sessions(limit=1000)
    assert [i.session_id for i in full.sessions] == seen


async def test_list_rejects_bad_arguments(store: SessionStore) -> None:
    """A bad page size or a tampered cursor is a ValueError."""
    with pytest.raises(ValueError, match="limit"):
        await store.list_sessions(limit=0)
    with pytest.raises(ValueError, match="cursor"):
        await store.list_sessions(cursor="not-a-cursor")


async def test_get_and_delete_session(store: SessionStore) -> None:
    """get_session describes one session; delete_session removes it and reports if it existed."""
    await store.session("a").add_items([{"x": 1}, {"x": 2}])
    info = await store.get_session("a")
    assert info is not None
    assert info.item_count == 2
    assert await store.delete_session("a") is True
    assert await store.delete_session("a") is False
    assert await store.get_session("a") is None
    assert await store.session("a").get_items() == []


async def test_store_from_url_and_close(backend: Any, names: Any) -> None:
    """A store made from a URL owns its engine and closes it on exit."""
    async with SessionStore.from_url(
        backend.url,
        sessions_table=names.sessions,
        messages_table=names.messages,
        create_tables=True,
    ) as st:
        await st.session("x").add_items([{"a": 1}])
        assert (await st.get_session("x")) is not None
        await st.delete_session("x")


async def test_servers_run_sessions_in_parallel(backend: Any, store: SessionStore) -> None:
    """On Postgres and MySQL, concurrent writes use several pooled connections (no global lock).

    On SQLite the writers queue on one per-engine lock instead, so writers never hold
    more than one pooled connection at a time (none at all once the store keeps its own
    connections; test_driver_path checks that SQLite writers never overlap).
    """
    in_use = 0
    peak = 0

    def checkout(*_: object) -> None:
        nonlocal in_use, peak
        in_use += 1
        peak = max(peak, in_use)

    def checkin(*_: object) -> None:
        nonlocal in_use
        in_use -= 1

    await store.session("warm").add_items([{"w": 1}])
    event.listen(store.engine.sync_engine, "checkout", checkout)
    event.listen(store.engine.sync_engine, "checkin", checkin)
    # Clears, not appends: on Postgres concurrent appends share one statement at a time per
    # engine and loop (group commit, test_pg_group_commit), so they need no second connection.
    await asyncio.gather(*(store.session(f"p{i}").clear_session() for i in range(32)))
    if backend.kind != "sqlite":
        assert peak > 1
    else:
        assert peak <= 1


async def test_metadata_set_get_and_filter(store: SessionStore) -> None:
    """Sessions carry JSON metadata; listing filters on exact top-level values."""
    a, b, c = store.session("a"), store.session("b"), store.session("c")
    assert await a.get_metadata() == {}
    await a.set_metadata({"user": "u1", "vip": True, "n": 3, "tags": ["x"], "deep": {"k": "ü"}})
    await b.set_metadata({"user": "u2", "vip": False, "n": 3.5})
    await c.add_items([{"x": 1}])
    assert await a.get_metadata() == {
        "user": "u1",
        "vip": True,
        "n": 3,
        "tags": ["x"],
        "deep": {"k": "ü"},
    }

    async def ids(**filters: Any) -> list[str]:
        page = await store.list_sessions(metadata=filters)
        return sorted(i.session_id for i in page.sessions)

    assert await ids(user="u1") == ["a"]
    assert await ids(vip=True) == ["a"]
    assert await ids(vip=False) == ["b"]
    assert await ids(n=3) == ["a"]
    assert await ids(n=3.5) == ["b"]
    assert await ids(user="u1", vip=False) == []
    assert await ids(user="nobody") == []
    info = await store.get_session("a")
    assert info is not None
    assert info.metadata["user"] == "u1"
    assert info.item_count == 0
    # replacing metadata keeps the items
    await c.set_metadata({"user": "u3"})
    assert await c.get_items() == [{"x": 1}]
    assert await ids(user="u3") == ["c"]


async def test_bad_metadata_is_refused(store: SessionStore) -> None:
    """Metadata that would not round-trip, or a malformed filter, is a typed error."""
    s = store.session("a")
    with pytest.raises(TypeError):
        await s.set_metadata({"x": object()})
    with pytest.raises(TypeError):
        await s.set_metadata(["not", "a", "dict"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="NaN"):
        await s.set_metadata({"x": float("nan")})
    assert await store.get_session("a") is None
    with pytest.raises(ValueError, match="filter"):
        await store.list_sessions(metadata={})
    with pytest.raises(ValueError, match="filter key"):
        await store.list_sessions(metadata={'a"b': 1})
    with pytest.raises(TypeError, match="filter value"):
        await store.list_sessions(metadata={"a": [1]})  # type: ignore[dict-item]


async def test_metadata_filter_matches_kind_and_value_exactly(store: SessionStore) -> None:
    """A filter matches only the same JSON kind: not 1 for True, not an array holding the value."""
    await store.session("bool").set_metadata({"v": True, "tags": ["x"], "s": "x"})
    await store.session("one").set_metadata({"v": 1, "tags": "x", "s": "x "})
    await store.session("text").set_metadata({"v": "1", "tags": {"x": 1}, "s": "X"})

    async def ids(**filters: Any) -> list[str]:
        page = await store.list_sessions(metadata=filters)
        return sorted(i.session_id for i in page.sessions)

    assert await ids(v=True) == ["bool"]
    assert await ids(v=1) == ["one"]
    assert await ids(v=1.0) == ["one"]
    assert await ids(v="1") == ["text"]
    assert await ids(tags="x") == ["one"]
    assert await ids(s="x") == ["bool"]
    assert await ids(s="x ") == ["one"]
    assert await ids(s="X") == ["text"]
    assert await ids(missing=True) == []


@pytest.mark.parametrize(
    "meta", [{"s": "nul \x00"}, {"s": "lone \ud800"}, {"k\x00": 1}, {"a": ["\udfff"]}]
)
async def test_metadata_a_json_column_cannot_hold_is_refused(
    store: SessionStore, meta: dict[str, Any]
) -> None:
    """NUL and lone surrogates in metadata are a ValueError on every backend, nothing written."""
    with pytest.raises(ValueError, match="metadata strings"):
        await store.session("a").set_metadata(meta)
    assert await store.get_session("a") is None
    with pytest.raises(ValueError, match="metadata strings"):
        await store.list_sessions(metadata={"s": "lone \ud800"})
    with pytest.raises(ValueError, match="finite"):
        await store.list_sessions(metadata={"n": float("nan")})


async def test_mariadb_url_gets_the_mysql_statements(
    backend: Any, engine: AsyncEngine, names: Any
) -> None:
    """A mariadb:// URL (SQLAlchemy's "mariadb" dialect) runs the same schema and statements."""
    if backend.kind != "mysql":
        pytest.skip("MySQL/MariaDB only")
    async with engine.connect():
        if not engine.dialect.is_mariadb:
            pytest.skip("the server is MySQL, which SQLAlchemy's mariadb dialect refuses")
    url = make_url(backend.url).set(drivername="mariadb")
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    async with SessionStore.from_url(url, create_tables=True, **kw) as st:
        assert st.engine.dialect.name == "mariadb"
        s = st.session("m")
        await s.add_items([{"i": i, "t": "😀"} for i in range(3)])
        await s.set_metadata({"user": "u1"})
        assert await s.pop_item() == {"i": 2, "t": "😀"}
        assert await s.get_items(limit=1) == [{"i": 1, "t": "😀"}]
        page = await st.list_sessions(metadata={"user": "u1"})
        assert [(i.session_id, i.item_count) for i in page.sessions] == [("m", 2)]
        assert await migrations.check(st.engine, **kw) == []
        assert await st.delete_session("m") is True
