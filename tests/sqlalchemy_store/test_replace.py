"""``replace_items``: the whole history swapped in one transaction, on every database and runner.

Round trip, bad input (nothing changes), odd table names, appends racing a
replace, a cancel at random points (and one landing while the replace waits on
the database's lock: provably mid-operation), and a process SIGKILLed while
replacing in a loop: the history is always exactly the old one or the new one.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import random
import signal
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import _replace_child
import pytest
from sqlalchemy import select, text

from agents_memory import SessionStore, TableNames
from agents_memory._databases import sqlite as lite
from agents_memory._databases.base import observed

OLD = [{"role": "user", "content": f"old {i}", "pad": "o" * 60} for i in range(300)]
NEW = [{"role": "assistant", "content": f"new {i}", "pad": "n" * 60} for i in range(200)]


async def test_replace_round_trip(rstore: SessionStore) -> None:
    """The new history replaces the old in order; the row, its metadata and neighbours stay."""
    s = rstore.session("r")
    other = rstore.session("other")
    await s.add_items(OLD[:5])  # type: ignore[arg-type]
    await other.add_items(OLD[:3])  # type: ignore[arg-type]
    await s.set_metadata({"user": "u1"})
    before = await rstore.get_session("r")
    assert before is not None
    await asyncio.sleep(0.01)
    await s.replace_items(NEW[:4])  # type: ignore[arg-type]
    assert await s.get_items() == NEW[:4]
    assert await s.get_items(limit=2) == NEW[2:4]
    after = await rstore.get_session("r")
    assert after is not None
    assert after.item_count == 4
    assert after.metadata == {"user": "u1"}
    assert after.created_at == before.created_at
    assert after.updated_at > before.updated_at
    assert await other.get_items() == OLD[:3]
    # the session goes on as usual afterwards
    await s.add_items([{"role": "user", "content": "next"}])
    assert (await s.get_items())[-1] == {"role": "user", "content": "next"}
    assert await s.pop_item() == {"role": "user", "content": "next"}


async def test_replace_creates_and_empties(rstore: SessionStore) -> None:
    """A missing session is created; ``[]`` empties the history but keeps the session."""
    s = rstore.session("fresh")
    await s.replace_items(NEW[:2])  # type: ignore[arg-type]
    assert await s.get_items() == NEW[:2]
    await s.replace_items([])
    assert await s.get_items() == []
    info = await rstore.get_session("fresh")
    assert info is not None
    assert info.item_count == 0


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ([{"ok": 1}, "not a dict"], TypeError),
        ([{"ok": 1}, {"x": object()}], TypeError),
        ([{"ok": 1}, {"x": float("nan")}], ValueError),
        ({"role": "user"}, TypeError),
        ("text", TypeError),
    ],
)
async def test_bad_input_changes_nothing(
    rstore: SessionStore, bad: Any, error: type[Exception]
) -> None:
    """A bad item is refused before anything is written: the old history is intact."""
    s = rstore.session("bad")
    await s.add_items(OLD[:7])  # type: ignore[arg-type]
    with pytest.raises(error):
        await s.replace_items(bad)
    assert await s.get_items() == OLD[:7]


async def test_odd_table_names(backend: Any, engine: Any, drop_set: Any) -> None:
    """Reserved words and mixed case in the table names: the statements quote them."""
    tag = uuid.uuid4().hex[:6]
    names = TableNames(f"Select_{tag}", f"Order_{tag}")
    store = SessionStore(
        engine, sessions_table=names.sessions, messages_table=names.messages, create_tables=True
    )
    try:
        s = store.session("odd")
        await s.add_items(OLD[:3])  # type: ignore[arg-type]
        await s.replace_items(NEW[:2])  # type: ignore[arg-type]
        assert await s.get_items() == NEW[:2]
        forked = await store.fork("odd", "odd2", at_turn=None)
        assert await forked.get_items() == NEW[:2]
    finally:
        if backend.kind != "sqlite":
            await drop_set(engine, names)
        await store.close()


async def test_appends_racing_a_replace_land_whole_before_or_after(rstore: SessionStore) -> None:
    """Batches appended while replaces run are either replaced away whole or kept whole after."""
    s = rstore.session("race")
    await s.add_items(OLD[:10])  # type: ignore[arg-type]

    async def appender(w: int) -> None:
        for b in range(15):
            await s.add_items([{"w": w, "b": b, "k": k} for k in range(3)])

    async def replacer() -> None:
        for r in range(6):
            await s.replace_items([{"r": r, "k": k} for k in range(5)])

    await asyncio.gather(*(appender(w) for w in range(4)), replacer())
    items = await s.get_items()
    head = [i for i in items if "r" in i]
    assert head == [{"r": 5, "k": k} for k in range(5)]
    assert items[:5] == head  # the last replace's items first, appends after it
    rest = items[5:]
    assert len(rest) % 3 == 0
    for start in range(0, len(rest), 3):
        chunk = rest[start : start + 3]
        assert [i["k"] for i in chunk] == [0, 1, 2]
        assert len({(i["w"], i["b"]) for i in chunk}) == 1


async def _measure(store: SessionStore) -> float:
    twin = store.session("twin")
    await twin.add_items(OLD)  # type: ignore[arg-type]
    started = time.perf_counter()
    await twin.replace_items(NEW)  # type: ignore[arg-type]
    return time.perf_counter() - started


async def test_cancel_at_random_points_leaves_old_or_new(rstore: SessionStore) -> None:
    """Cancelled at random moments, a replace leaves exactly the old or the new history.

    Some cancels land while the replace is still running (the task was not done
    when cancelled) and it still ended whole: that is the case the test is for.
    """
    seconds = await _measure(rstore)
    trials = 30
    hits = old = new = 0
    for trial in range(trials):
        s = rstore.session(f"c{trial}")
        await s.add_items(OLD)  # type: ignore[arg-type]
        task = asyncio.ensure_future(s.replace_items(NEW))  # type: ignore[arg-type]
        if trial % 2:
            for _ in range(random.randint(0, 6)):
                await asyncio.sleep(0)
        else:
            await asyncio.sleep(random.uniform(0, seconds))
        hits += not task.done()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        now = await s.get_items()
        assert now in (OLD, NEW), f"trial {trial}: {len(now)} items, neither old nor new"
        old += now == OLD
        new += now == NEW
    assert hits > 0, "no cancel landed before the replace finished"
    assert old + new == trials
    # the store still works
    await rstore.session("after").replace_items([{"ok": True}])
    assert await rstore.session("after").get_items() == [{"ok": True}]


@contextlib.asynccontextmanager
async def _session_row_locked(store: SessionStore, session_id: str) -> AsyncIterator[None]:
    """Hold the session row's lock (``SELECT … FOR UPDATE``) in another transaction."""
    sessions = store._backend.st.sessions
    async with store.engine.connect() as conn, conn.begin():
        query = select(sessions.c.session_id).where(sessions.c.session_id == session_id)
        await conn.execute(query.with_for_update())
        yield


async def _waiting_on_a_lock(store: SessionStore, kind: str) -> int:
    """How many statements on this test's sessions table wait for a row lock right now."""
    if kind == "postgres":
        query = text(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND strpos(query, :t) > 0"
        )
    else:
        query = text(
            "SELECT count(*) FROM information_schema.innodb_trx "
            "WHERE trx_state = 'LOCK WAIT' AND locate(:t, trx_query) > 0"
        )
    async with store.engine.connect() as conn:
        return int((await conn.execute(query, {"t": store.table_names.sessions})).scalar_one())


async def test_cancel_while_waiting_on_the_session_lock(backend: Any, rstore: SessionStore) -> None:
    """A replace cancelled while it provably waits on the session row's lock leaves one history.

    The replace has started on the server (it is seen waiting for the lock) when
    the cancel lands: the driver runner drops the connection, so the server rolls
    it back (old history); the SQLAlchemy runner on MySQL finishes it first (new).
    """
    if backend.kind == "sqlite":
        await _cancel_while_waiting_on_the_file_lock(backend, rstore)
        return
    s = rstore.session("locked")
    await s.add_items(OLD)  # type: ignore[arg-type]
    async with _session_row_locked(rstore, "locked"):
        task = asyncio.ensure_future(s.replace_items(NEW))  # type: ignore[arg-type]
        for _ in range(200):
            await asyncio.sleep(0.02)
            if await _waiting_on_a_lock(rstore, backend.kind):
                break
        else:
            pytest.fail("the replace never reached the lock")
        assert not task.done()
        task.cancel()
        await asyncio.sleep(0.05)
    with contextlib.suppress(asyncio.CancelledError):
        await task
    now = await s.get_items()
    assert now in (OLD, NEW)
    if not observed(rstore.engine):
        assert now == OLD  # cancelled on the server, rolled back
    await s.replace_items(NEW[:3])  # type: ignore[arg-type]
    assert await s.get_items() == NEW[:3]


async def _cancel_while_waiting_on_the_file_lock(backend: Any, store: SessionStore) -> None:
    """SQLite: another connection holds the file's write lock; the replace waits for it.

    On the driver runner the writer thread has taken the replace (nothing queued)
    and sits in ``BEGIN IMMEDIATE``: a cancel then withdraws it before it joins the
    transaction, so it never runs (old history). The SQLAlchemy runner finishes
    what it started (new history).
    """
    if backend.id == "sqlite-memory":
        pytest.skip("an in-memory database has one connection: nobody else can hold its lock")
    s = store.session("locked")
    await s.add_items(OLD)  # type: ignore[arg-type]
    path = str(store.engine.url.database)
    blocker = sqlite3.connect(path, isolation_level=None, timeout=30)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        task = asyncio.ensure_future(s.replace_items(NEW))  # type: ignore[arg-type]
        await asyncio.sleep(0.3)
        assert not task.done()  # it cannot finish while the lock is held
        if not observed(store.engine):
            assert lite._threads_for(store.engine).writer.pending() == 0  # taken: in BEGIN
        task.cancel()
        await asyncio.sleep(0.05)
    finally:
        blocker.rollback()
        blocker.close()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    now = await s.get_items()
    assert now in (OLD, NEW)
    if not observed(store.engine):
        assert now == OLD  # withdrawn before it joined the transaction
    await s.replace_items(NEW[:3])  # type: ignore[arg-type]
    assert await s.get_items() == NEW[:3]


# -- SIGKILL ------------------------------------------------------------------------------------

PRELOAD = ["agents_memory", "sqlalchemy.ext.asyncio", "aiosqlite", "asyncpg", "_replace_child"]


def _context() -> Any:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


async def _kill_one(ctx: Any, url: str, tables: tuple[str, str], start: int) -> list[int]:
    """Start a replacing child, let it run for a random time, SIGKILL it; its acknowledgements."""
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_replace_child.main, args=(url, tables, start, writer), daemon=True)
    proc.start()
    writer.close()
    try:
        first = await asyncio.to_thread(reader.recv_bytes)
        assert first == b"ready", first
        await asyncio.sleep(random.uniform(0.05, 0.4))
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        await asyncio.to_thread(proc.join, 30)
    acked = []
    while True:
        try:
            acked.append(int(reader.recv_bytes()))
        except EOFError:
            break
    reader.close()
    return acked


async def test_sigkill_while_replacing_leaves_one_whole_generation(
    file_backend: Any, store: SessionStore
) -> None:
    """Kill -9 a process replacing a history in a loop, many times: always one whole history.

    After each kill the history is exactly one generation, the last acknowledged
    one or the one in flight at the kill (committed, not yet acknowledged).
    """
    session = store.session("crash")
    await session.replace_items(_replace_child.generation(0))  # type: ignore[arg-type]
    names = store.table_names
    ctx = _context()
    start = 1
    in_flight = 0
    for _ in range(8):
        acked = await _kill_one(ctx, file_backend.url, (names.sessions, names.messages), start)
        items = await session.get_items()
        assert items, "the history is empty after a kill"
        g = items[0]["g"]
        assert items == _replace_child.generation(g), f"generation {g} is torn"
        last = acked[-1] if acked else start - 1
        assert g in (last, last + 1), (g, last)
        in_flight += g == last + 1
        start = max(g, last) + 1
    assert start > 8, "the children never got a replace through"


# -- lost connection ----------------------------------------------------------------------------


@pytest.mark.direct_postgres("application_name identifies a client's backends only directly")
async def test_lost_connection_mid_replace_leaves_one_whole_history(
    backend: Any, names: TableNames
) -> None:
    """Postgres backends terminated in the middle of replaces: old or new history, whole.

    Each replace's backend is terminated as soon as it is seen working (in a
    statement, or in its transaction between statements). The replace then
    either raises ``DatabaseConnectionError`` or is run again on a fresh
    connection (what was cut off was rolled back); the history is always one
    whole generation.
    """
    if backend.kind != "postgres":
        pytest.skip("terminating backends needs a Postgres server")
    from agents_memory import DatabaseConnectionError, create_engine  # noqa: PLC0415

    app = f"am_rep_{uuid.uuid4().hex[:8]}"
    store = SessionStore.from_url(
        backend.url,
        sessions_table=names.sessions,
        messages_table=names.messages,
        create_tables=True,
        engine_kwargs={"connect_args": {"server_settings": {"application_name": app}}},
    )
    admin = create_engine(backend.url)
    # the backend of ours that is inside a statement or a transaction right now
    busy = text(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = :a AND state <> 'idle'"
    )
    try:
        s = store.session("lost")
        await s.replace_items(_replace_child.generation(0) * 20)  # type: ignore[arg-type]
        errors = kills = 0
        # autocommit: pg_stat_activity is a snapshot per transaction
        watcher = admin.execution_options(isolation_level="AUTOCOMMIT")
        admin_conn = await watcher.connect()  # open already: the kill lands at once
        for g in range(1, 16):
            task = asyncio.ensure_future(
                s.replace_items(_replace_child.generation(g) * 20)  # type: ignore[arg-type]
            )
            killed = False
            while not task.done() and not killed:  # kill it once seen working on the server
                killed = any(row[0] for row in (await admin_conn.execute(busy, {"a": app})).all())
            kills += killed
            try:
                await task
            except DatabaseConnectionError:
                errors += 1
            items = await s.get_items()
            got = items[0]["g"]
            assert got in (g - 1, g)
            assert items == _replace_child.generation(got) * 20, f"generation {got} torn"
            if got != g:  # not applied: the next round expects this one as the old history
                await s.replace_items(_replace_child.generation(g) * 20)  # type: ignore[arg-type]
        # a raised error or a transparent re-run are both fine: wholeness is what is checked
        assert kills > 0, f"no termination landed during a replace ({errors} errors)"
        await admin_conn.close()
    finally:
        await store.close()
        await admin.dispose()
