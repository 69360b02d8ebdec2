"""Resources: unclosed stores, bursts, connections closed while idle, microsecond times.

Nothing leaks from an unclosed store, bursts do not churn connections, a
connection the server closed while idle is replaced, times are kept to the
microsecond.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, text

from agents_memory import SessionStore, create_engine, migrations


def _fds() -> int:
    return len(list(Path("/proc/self/fd").iterdir()))


def _threads() -> set[threading.Thread]:
    """The process's live threads, by identity.

    Not a count: that also moves when a thread started before the test (an earlier
    test's, the test runner's) ends meanwhile.
    """
    return set(threading.enumerate())


@contextmanager
def _only_new_objects_collected() -> Iterator[None]:
    """Freeze what the process already holds, so ``gc.collect()`` walks only what is new.

    Late in a run the suite holds ~1.5 million objects and a full collection took about a
    second; the tests here collect up to ten times. Frozen objects are skipped by the
    collector, not kept alive any longer; what a test makes inside the block is not frozen.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


async def test_unclosed_stores_give_back_threads_and_descriptors(tmp_path: Path) -> None:
    """200 from_url() stores on SQLite files, used and dropped without close().

    Each warns (ResourceWarning, as an unclosed file does) and, once collected,
    holds no thread and no file descriptor.
    """
    url = f"sqlite:///{tmp_path / 'leak.db'}"
    await migrations.upgrade(url)
    with _only_new_objects_collected():
        await _drop_unclosed_stores(url)


async def _drop_unclosed_stores(url: str) -> None:
    threads_before, fds_before = _threads(), _fds()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for i in range(200):
            store = SessionStore.from_url(url)
            s = store.session(f"s{i}")
            await s.add_items([{"i": i}])
            assert await s.get_items() == [{"i": i}]
            assert _threads() - threads_before  # the store did start its threads
            del s, store
            if i % 25 == 24:  # (a full collection is slow with the SDK loaded: not every time)
                gc.collect()
        await asyncio.sleep(0.2)  # stopped threads finish closing their connections
        gc.collect()
    unclosed = [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert len(unclosed) >= 200
    assert "never closed" in str(unclosed[0].message)
    assert not [t.name for t in _threads() - threads_before]  # each has ended
    assert _fds() <= fds_before + 2  # (the collector may hold a descriptor or two briefly)
    check = SessionStore.from_url(url)
    try:
        assert (await check.stats()).items == 200  # nothing was lost on the way
    finally:
        await check.close()


async def test_closed_store_warns_nothing(tmp_path: Path) -> None:
    """close() (or async with) is the normal way out: no warning."""
    url = f"sqlite:///{tmp_path / 'ok.db'}"
    with _only_new_objects_collected(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        async with SessionStore.from_url(url, create_tables=True) as store:
            await store.session("s").add_items([{"i": 1}])
        del store
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


async def test_bursts_do_not_churn_connections(backend: Any, names: Any) -> None:
    """64 sessions at once, 5 rounds: connections are opened once, never per burst."""
    if backend.kind == "sqlite":
        pytest.skip("SQLite's runner has two connections per engine, not a pool")
    engine = create_engine(backend.url)
    opened: list[int] = []
    event.listen(engine.sync_engine, "connect", lambda *_: opened.append(1))
    store = SessionStore(
        engine, sessions_table=names.sessions, messages_table=names.messages, create_tables=True
    )
    try:
        for burst in range(5):
            await asyncio.gather(
                *(store.session(f"s{i}").add_items([{"b": burst}]) for i in range(64))
            )
            await asyncio.gather(*(store.session(f"s{i}").get_items(limit=5) for i in range(64)))
            if burst == 0:
                after_first = len(opened)
        assert after_first <= engine.sync_engine.pool.size() + 1  # (+1: the schema check's)
        assert len(opened) == after_first  # bursts 2..5 opened nothing
        assert await store.session("s63").get_items() == [{"b": b} for b in range(5)]
    finally:
        await store.close()
        await engine.dispose()


async def test_mariadb_connection_closed_while_idle_is_replaced(backend: Any, names: Any) -> None:
    """The server closes idle connections (wait_timeout); the next operations just work."""
    if backend.kind != "mysql":
        pytest.skip("MySQL/MariaDB's wait_timeout")
    engine = create_engine(backend.url, connect_args={"init_command": "SET SESSION wait_timeout=1"})
    store = SessionStore(
        engine, sessions_table=names.sessions, messages_table=names.messages, create_tables=True
    )
    s = store.session("idle")
    try:
        await s.add_items([{"i": 0}])
        assert await s.get_items() == [{"i": 0}]
        await asyncio.sleep(2.5)  # the server has closed every connection we hold
        await s.add_items([{"i": 1}])  # a write: the dead connection fails before COMMIT
        await asyncio.sleep(2.5)
        assert await s.get_items() == [{"i": 0}, {"i": 1}]  # a read
        await asyncio.sleep(2.5)
        assert await s.pop_item() == {"i": 1}
        assert await store.list_sessions()  # the engine's own pool (pre-ping)
    finally:
        await store.close()
        await engine.dispose()


async def test_times_have_microseconds(store: SessionStore) -> None:
    """Writes a millisecond apart get distinct, ordered times on every database."""
    order = [f"t{i}-{uuid.uuid4().hex[:4]}" for i in range(5)]
    for sid in order:
        await store.session(sid).add_items([{"sid": sid}])
        await asyncio.sleep(0.001)
    infos = [await store.get_session(sid) for sid in order]
    stamps = [info.updated_at for info in infos if info is not None]
    assert stamps == sorted(stamps)
    assert len(set(stamps)) == len(stamps)
    assert any(stamp.microsecond % 1000 for stamp in stamps)  # finer than milliseconds
    page = await store.list_sessions()
    assert [i.session_id for i in page.sessions] == list(reversed(order))
    async with store.engine.connect() as conn:  # what is stored, not only what is returned
        m = store.table_names.messages
        raw = (await conn.execute(text(f"SELECT created_at FROM {m}"))).scalars().all()
    assert len(raw) == len(order)
