"""Group commit for appends on Postgres (``_databases/postgres_groups.py``), on a real server.

Appends group only when every pooled connection of the loop holds one (the appender's
slots, the engine's ``pool_size``), so the tests make that certain rather than likely:
engines with a pool of one to four connections (``max_overflow=0``), and outside
transactions holding session rows, so that the appends alone in flight wait on the
server while the others queue; when a lock is released, what queued goes out as one
statement. (The wait limit, ``GROUP_MAX_WAIT``, is lifted so that a loaded machine
cannot send a queued batch alone; its own test sets it.) What a test claims is proven
from the database itself: rows a transaction inserted share its ``xmin``, so the
number of distinct ``xmin`` values among the new rows is the number of transactions
that wrote them; and ``pg_stat_activity`` shows which statements wait on a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
import pytest
from group_waits import item, until
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url

from agents_memory import DatabaseConnectionError, SessionStore, TableNames, create_engine
from agents_memory._databases import pool as driver_pool
from agents_memory._databases import postgres_groups
from agents_memory._databases.base import GROUP_COMMIT_OPTION
from agents_memory._databases.postgres import Postgres
from agents_memory._sqlalchemy._store import backend_of


@pytest.fixture(autouse=True)
def no_wait_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Queued batches wait for their group however long a held lock keeps the leader waiting."""
    monkeypatch.setattr(postgres_groups, "GROUP_MAX_WAIT", None)


@pytest.fixture
def pg(backend: Any) -> Any:
    """The backend, when it is Postgres (directly or through PgBouncer)."""
    if backend.kind != "postgres":
        pytest.skip("group commit for appends on Postgres")
    return backend


def driver_url(url: str) -> str:
    """The backend's URL for asyncpg itself (no SQLAlchemy driver suffix)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


async def outside(url: str) -> asyncpg.Connection:
    """A connection of the test's own (statement cache off: it may go through PgBouncer)."""
    return await asyncpg.connect(driver_url(url), statement_cache_size=0)


@contextlib.asynccontextmanager
async def store_on(
    url: str, names: TableNames, slots: int, options: dict[str, bool] | None = None
) -> AsyncIterator[SessionStore]:
    """A store whose engine pools ``slots`` connections (no overflow): the appender's slots.

    The tables are made through an engine of the default pool first (making them
    probes advisory locks with two connections at once, beside the migration's own).
    """
    maker = create_engine(url)
    made = SessionStore(
        maker, sessions_table=names.sessions, messages_table=names.messages, create_tables=True
    )
    await made.session("warm").get_items()  # (the tables are made by the first operation)
    await made.close()
    await maker.dispose()
    engine = create_engine(url, pool_size=slots, max_overflow=0, execution_options=options or {})
    s = SessionStore(engine, sessions_table=names.sessions, messages_table=names.messages)
    try:
        await s.session("warm").add_items([item(-1, 0)])  # schema checked: driver path writes
        yield s
    finally:
        await s.close()
        await engine.dispose()


@pytest.fixture
async def gstore(pg: Any, names: TableNames) -> AsyncIterator[SessionStore]:
    """A store with one slot (grouping on by default): one append in flight, the rest queue."""
    async with store_on(pg.url, names, 1) as s:
        yield s


def appender(store: SessionStore) -> postgres_groups.GroupedAppender:
    slots = driver_pool.engine_pool_size(store.engine)
    return postgres_groups.appenders_for(store.engine, store.table_names, slots=slots).current()


def driver_pool_of(store: SessionStore) -> driver_pool.DriverPool[Any]:
    """The running loop's driver pool of the store's engine (made by its first operation)."""

    def unused() -> driver_pool.DriverPool[Any]:
        raise AssertionError("the store has no driver pool yet")

    return driver_pool.pools_for(store.engine, unused).current()


def saturated(a: postgres_groups.GroupedAppender) -> bool:
    """Every slot holds an append in flight: the next ones queue."""
    return a._in_flight == a.slots


async def waiting_on_locks(conn: asyncpg.Connection, names: TableNames, *, groups: bool) -> int:
    """How many of the store's appends (group statements, or single ones) wait on a row lock.

    ``conn`` may be a holder's, in a transaction: the snapshot of the server's activity
    taken there is dropped first, else the transaction would keep seeing its first one.
    """
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE $1 AND (query LIKE 'WITH g AS%') = $2",
            f"%{names.sessions}%",  # (early in both texts: the server keeps their first 1 kB)
            groups,
        )
    )


async def until_waiting(
    conn: asyncpg.Connection, names: TableNames, n: int, *, groups: bool
) -> None:
    """Wait until ``n`` of the store's appends (groups or single ones) wait on row locks."""
    for _ in range(2000):
        if await waiting_on_locks(conn, names, groups=groups) == n:
            return
        await asyncio.sleep(0.01)
    msg = f"never saw {n} {'group' if groups else 'single'} appends waiting on locks"
    raise AssertionError(msg)


async def rows_of(conn: asyncpg.Connection, names: TableNames) -> list[asyncpg.Record]:
    """Every item row but the warm-up's: session, position, content, writing transaction."""
    return list(
        await conn.fetch(
            f'SELECT session_id, position, message_data, xmin::text AS tx FROM "{names.messages}" '
            "WHERE session_id <> 'warm' ORDER BY session_id, position"
        )
    )


class Holder:
    """An outside transaction holding session rows ``FOR UPDATE`` until released."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.tx = conn.transaction()

    async def hold(self, names: TableNames, *sids: str) -> None:
        """Make the session rows (committed), then lock them in an open transaction."""
        for sid in sids:  # (the rows must exist to be locked)
            await self.conn.execute(
                f'INSERT INTO "{names.sessions}" (session_id) VALUES ($1) ON CONFLICT DO NOTHING',
                sid,
            )
        await self.tx.start()
        for sid in sids:
            await self.conn.execute(
                f'SELECT 1 FROM "{names.sessions}" WHERE session_id = $1 FOR UPDATE', sid
            )

    async def release(self) -> None:
        """Commit: the waiting statements go on."""
        await self.tx.commit()


async def writer(store: SessionStore, prefix: str, w: int, turns: int) -> None:
    """Writer ``w``: ``turns`` turns of three items, one after another, to ``prefix{w % 8}``."""
    s = store.session(f"{prefix}{w % 8}")
    for k in range(turns):
        await s.add_items([item(w, k * 3 + j) for j in range(3)])


async def test_concurrent_appends_group_and_land_contiguous(
    gstore: SessionStore, pg: Any, names: TableNames
) -> None:
    """32 writers x 5 turns (8 sessions of 4 writers each): all there, each turn contiguous."""
    conn = await outside(pg.url)
    try:
        holder = Holder(conn)
        await holder.hold(names, "s0")
        writers, turns = 32, 5

        tasks = [asyncio.create_task(writer(gstore, "s", w, turns)) for w in range(writers)]
        a = appender(gstore)
        await until(lambda: len(a._queue) == writers - 1)  # first alone, waiting on the lock
        await holder.release()
        await asyncio.gather(*tasks)
        rows = await rows_of(conn, names)
    finally:
        await conn.close()
    assert max(a.groups) > 1, a.groups  # the race happened: groups of several batches formed
    await check_turns(gstore, rows, "s", writers, turns)
    transactions = len({r["tx"] for r in rows})
    assert transactions < writers * turns  # fewer transactions than batches: they grouped


async def check_turns(
    store: SessionStore, rows: list[asyncpg.Record], prefix: str, writers: int, turns: int
) -> None:
    """Writer ``w`` appended ``turns`` turns of three items to session ``prefix{w % 8}``.

    All there; each turn's items adjacent, in order and in one transaction; each
    writer's turns in its own order; the store reads what the table holds.
    """
    rows = [r for r in rows if r["session_id"].startswith(prefix)]
    assert len(rows) == writers * turns * 3
    for sid in {f"{prefix}{i}" for i in range(8)}:
        mine = [r for r in rows if r["session_id"] == sid]
        assert [r["position"] for r in mine] == list(range(1, len(mine) + 1))
        contents = [json.loads(r["message_data"])["content"] for r in mine]
        for i in range(0, len(mine), 3):
            w, k = contents[i].split()
            assert contents[i : i + 3] == [f"{w} k{int(k[1:]) + j}" for j in range(3)]
            assert len({r["tx"] for r in mine[i : i + 3]}) == 1
        for w in range(writers):
            if f"{prefix}{w % 8}" == sid:
                ks = [int(c.split()[1][1:]) for c in contents if c.split()[0] == f"w{w}"]
                assert ks == list(range(turns * 3))
        got = await store.session(sid).get_items()
        assert [i["content"] for i in got] == contents


async def test_expired_sessions_start_afresh_in_a_group(
    gstore: SessionStore, pg: Any, names: TableNames
) -> None:
    """In one group, an expired session loses its old items, a live one keeps them."""
    for sid in ("old", "live"):
        await gstore.session(sid).add_items([item(0, 0), item(0, 1)])
    conn = await outside(pg.url)
    try:
        await conn.execute(
            f'UPDATE "{names.sessions}" SET expires_at = $1 WHERE session_id = $2',
            dt.datetime(2000, 1, 1),  # noqa: DTZ001 - naive UTC, as the store writes it
            "old",
        )
        holder = Holder(conn)
        await holder.hold(names, "first")
        first = asyncio.create_task(gstore.session("first").add_items([item(1, 0)]))
        a = appender(gstore)
        await until(lambda: saturated(a))
        later = [
            asyncio.create_task(gstore.session(sid).add_items([item(2, 10), item(2, 11)]))
            for sid in ("old", "live", "old")
        ]
        await until(lambda: len(a._queue) == 3)
        await holder.release()
        await asyncio.gather(first, *later)
        rows = await rows_of(conn, names)
        deadline = await conn.fetchval(
            f'SELECT expires_at FROM "{names.sessions}" WHERE session_id = $1', "old"
        )
    finally:
        await conn.close()
    assert a.groups[3] == 1, a.groups
    old = [r for r in rows if r["session_id"] == "old"]
    assert [json.loads(r["message_data"])["content"] for r in old] == ["w2 k10", "w2 k11"] * 2
    assert [r["position"] for r in old] == [3, 4, 5, 6]  # the counter goes on; old items gone
    assert deadline is None  # an expired deadline is cleared (no ttl on this store)
    live = await gstore.session("live").get_items()
    assert [i["content"] for i in live] == ["w0 k0", "w0 k1", "w2 k10", "w2 k11"]


async def test_a_bad_batch_in_a_group_fails_alone(
    gstore: SessionStore, pg: Any, names: TableNames
) -> None:
    """The group is refused; retried batch by batch, only the too-long id's caller fails."""
    backend = backend_of(gstore)
    data = ['{"type": "message", "role": "user", "content": "x"}']
    bad = "b" * 300  # past the column's 255 (the store's own check is bypassed here)
    with pytest.raises(sa_exc.DBAPIError) as alone:
        await backend.add(bad, data)
    conn = await outside(pg.url)
    try:
        holder = Holder(conn)
        await holder.hold(names, "first")
        first = asyncio.create_task(backend.add("first", data))
        a = appender(gstore)
        await until(lambda: saturated(a))
        sids = [f"g{i}" for i in range(6)] + [bad] + [f"g{i}" for i in range(3)]
        tasks = [asyncio.create_task(backend.add(sid, data)) for sid in sids]
        await until(lambda: len(a._queue) == len(sids))
        await holder.release()
        outcomes = await asyncio.gather(first, *tasks, return_exceptions=True)
        rows = await rows_of(conn, names)
    finally:
        await conn.close()
    assert a.fallbacks == 1
    assert a.groups[len(sids)] == 1, a.groups
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(errors) == 1
    assert outcomes[1 + sids.index(bad)] is errors[0]
    assert type(errors[0]) is type(alone.value)  # mapped as the same batch alone is
    assert type(errors[0].__cause__) is type(alone.value.__cause__)
    assert errors[0].orig.sqlstate == "22001"  # type: ignore[attr-defined]
    counts = {sid: sum(r["session_id"] == sid for r in rows) for sid in set(sids) - {bad}}
    assert counts == {**{f"g{i}": 1 for i in range(6)}, **{f"g{i}": 2 for i in range(3)}}


async def test_cancel_before_sending_withdraws_the_batch(
    gstore: SessionStore, pg: Any, names: TableNames
) -> None:
    conn = await outside(pg.url)
    try:
        holder = Holder(conn)
        await holder.hold(names, "first")
        first = asyncio.create_task(gstore.session("first").add_items([item(0, 0)]))
        a = appender(gstore)
        await until(lambda: saturated(a))
        gone = asyncio.create_task(gstore.session("gone").add_items([item(1, 0)]))
        kept = asyncio.create_task(gstore.session("kept").add_items([item(2, 0)]))
        await until(lambda: len(a._queue) == 2)
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone  # at once: the statement holding "first" is still waiting on the lock
        assert not first.done()
        withdrawn = [b for b in a._queue if b.sid == "gone"]
        assert withdrawn
        assert withdrawn[0].withdrawn
        assert not withdrawn[0].sent
        await holder.release()
        await asyncio.gather(first, kept)
        rows = await rows_of(conn, names)
    finally:
        await conn.close()
    assert a.groups == {1: 1}  # the leader sent "kept" alone: the withdrawn batch never went
    assert sorted(r["session_id"] for r in rows) == ["first", "kept"]


async def sent_group_waiting_on_z(
    gstore: SessionStore,
    names: TableNames,
    conn: asyncpg.Connection,
    group_lock: Holder,
    batches: dict[str, list[dict[str, Any]]],
) -> list[asyncio.Task[None]]:
    """``batches`` sent as one group that waits on session "z"'s row (held by ``group_lock``).

    A first append, alone, waits on a lock held on ``conn`` while the batches queue behind
    it; released, it lands and the leader sends the queue as one statement.
    """
    first_lock = Holder(conn)
    await first_lock.hold(names, "first")
    await group_lock.hold(names, "z")
    first = asyncio.create_task(gstore.session("first").add_items([item(0, 0)]))
    a = appender(gstore)
    await until(lambda: saturated(a))
    tasks = [asyncio.create_task(gstore.session(sid).add_items(b)) for sid, b in batches.items()]
    await until(lambda: len(a._queue) == len(batches))
    await first_lock.release()
    await first
    await until(lambda: a.groups[len(batches)] == 1)  # sent; it waits on "z"
    return tasks


async def test_cancel_after_sending_waits_for_the_outcome(
    gstore: SessionStore, pg: Any, names: TableNames
) -> None:
    """A caller cancelled while its group's statement waits on the server: it lands, then raises."""
    one, two = await outside(pg.url), await outside(pg.url)
    try:
        group_lock = Holder(two)
        cancelled, blocked = await sent_group_waiting_on_z(
            gstore, names, one, group_lock, {"a": [item(1, 0), item(1, 1)], "z": [item(2, 0)]}
        )
        cancelled.cancel()
        await asyncio.sleep(0.2)
        assert not cancelled.done()  # waiting for the statement that holds its batch
        await group_lock.release()
        with pytest.raises(asyncio.CancelledError):
            await cancelled
        await blocked
        rows = await rows_of(one, names)
    finally:
        await one.close()
        await two.close()
    a_rows = [r for r in rows if r["session_id"] == "a"]
    assert [r["position"] for r in a_rows] == [1, 2]  # it was committed before the cancel rose
    assert len({r["tx"] for r in rows if r["session_id"] in ("a", "z")}) == 1


async def test_a_batch_held_up_by_locked_sessions_goes_alone(
    pg: Any, names: TableNames, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every slot waits on a lock; a batch queued behind them leaves the queue and goes alone.

    It then waits for a pooled connection as without grouping: the first one freed
    (by "stuck2") is handed to it, and it lands while "stuck1" still waits.
    """
    monkeypatch.setattr(postgres_groups, "GROUP_MAX_WAIT", 0.05)
    one, two = await outside(pg.url), await outside(pg.url)
    try:
        async with store_on(pg.url, names, 2) as store:
            first_lock, second_lock = Holder(one), Holder(two)
            await first_lock.hold(names, "stuck1")
            await second_lock.hold(names, "stuck2")
            stuck = [
                asyncio.create_task(store.session(sid).add_items([item(0, 0)]))
                for sid in ("stuck1", "stuck2")
            ]
            a = appender(store)
            await until(lambda: saturated(a))
            free = asyncio.create_task(store.session("free").add_items([item(1, 0)]))
            await until(lambda: a.escaped == 1)  # unsent after 0.05 s: withdrawn, alone
            await second_lock.release()
            await asyncio.wait_for(free, 10)
            assert stuck[1].done()
            assert not stuck[0].done()  # still waiting on the lock: "free" did not wait for it
            await first_lock.release()
            await asyncio.gather(*stuck)
        rows = await rows_of(one, names)
    finally:
        await one.close()
        await two.close()
    assert a.alone == 3  # the warm-up's, and the two held up
    assert not a.groups  # the slot freed found only the withdrawn batch: nothing sent twice
    assert sorted(r["session_id"] for r in rows) == ["free", "stuck1", "stuck2"]


@pytest.mark.direct_postgres("terminates the server connection running the group")
async def test_a_lost_connection_fails_every_caller_of_the_group(
    gstore: SessionStore, pg: Any, names: TableNames
) -> None:
    one, two = await outside(pg.url), await outside(pg.url)
    try:
        group_lock = Holder(two)
        tasks = await sent_group_waiting_on_z(
            gstore, names, one, group_lock, {sid: [item(1, 0)] for sid in "abz"}
        )
        pid = None
        for _ in range(400):
            pid = await one.fetchval(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%unnest%' AND query LIKE $1",
                f"%{names.sessions}%",
            )
            if pid is not None:
                break
            await asyncio.sleep(0.01)
        assert pid is not None
        await one.execute("SELECT pg_terminate_backend($1)", pid)
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        await group_lock.release()
        rows = await rows_of(one, names)
    finally:
        await one.close()
        await two.close()
    assert all(isinstance(o, DatabaseConnectionError) for o in outcomes), outcomes
    assert len({str(o) for o in outcomes}) == 1  # the same error, as for one statement
    assert [r["session_id"] for r in rows] == ["first"]  # the group rolled back whole
    await gstore.session("a").add_items([item(3, 0)])  # and the next append works


@pytest.mark.parametrize("option", [{}, {GROUP_COMMIT_OPTION: False}], ids=["default", "off"])
async def test_on_by_default_off_when_asked(
    pg: Any, names: TableNames, option: dict[str, bool]
) -> None:
    """Both connections of a pool of two wait on locks while ten more appends arrive.

    By default those ten queue and go out as one statement when a connection frees;
    with ``agents_memory_group_commit=False`` each batch is its own statement.
    """
    on = option.get(GROUP_COMMIT_OPTION, True)
    conn = await outside(pg.url)
    try:
        async with store_on(pg.url, names, 2, option) as store:
            holder = Holder(conn)
            await holder.hold(names, "s0", "s1")
            tasks = [
                asyncio.create_task(store.session(f"s{w}").add_items([item(w, 0), item(w, 1)]))
                for w in range(2)
            ]
            await until_waiting(conn, names, 2, groups=False)  # both connections held up
            tasks += [
                asyncio.create_task(store.session(f"s{w}").add_items([item(w, 0), item(w, 1)]))
                for w in range(2, 12)
            ]
            if on:
                a = appender(store)
                await until(lambda: len(a._queue) == 10)
            else:
                pool = driver_pool_of(store)
                await until(lambda: len(pool._waiters) == 10)  # each waits for a connection
            await holder.release()
            await asyncio.gather(*tasks)
        rows = await rows_of(conn, names)
    finally:
        await conn.close()
    assert len(rows) == 24
    made = postgres_groups.appenders_for(store.engine, names, slots=2).by_loop
    if on:
        assert a.alone == 1 + 2  # the warm-up's, and the two held up
        assert a.groups == {10: 1}
        assert len({r["tx"] for r in rows}) == 3  # two alone, then one group of ten
    else:
        assert not made  # no appender ever made
        assert len({r["tx"] for r in rows}) == 12  # one transaction per batch


async def test_free_connections_mean_no_grouping(pg: Any, names: TableNames) -> None:
    """With a connection free, each append is its own statement; only past the pool they queue.

    Four appends on a pool of four wait on the server at once, each alone on its own
    connection; the fifth and sixth find every slot taken and queue, then go as one group.
    """
    conn = await outside(pg.url)
    try:
        async with store_on(pg.url, names, 4) as store:
            holder = Holder(conn)
            await holder.hold(names, "s0", "s1", "s2", "s3")
            tasks = [
                asyncio.create_task(store.session(f"s{w}").add_items([item(w, 0), item(w, 1)]))
                for w in range(4)
            ]
            a = appender(store)
            await until_waiting(conn, names, 4, groups=False)  # four statements, four connections
            assert a.alone == 1 + 4  # the warm-up's, and these
            assert not a._queue
            tasks += [
                asyncio.create_task(store.session(f"s{w}").add_items([item(w, 0)])) for w in (4, 5)
            ]
            await until(lambda: len(a._queue) == 2)
            assert a.alone == 1 + 4  # the pool is saturated: they queued
            await holder.release()
            await asyncio.gather(*tasks)
        rows = await rows_of(conn, names)
    finally:
        await conn.close()
    assert a.groups == {2: 1}
    tx = {
        sid: {r["tx"] for r in rows if r["session_id"] == sid} for sid in ("s0", "s1", "s2", "s3")
    }
    assert all(len(t) == 1 for t in tx.values())
    assert len(set().union(*tx.values())) == 4  # one transaction each: not grouped
    assert len({r["tx"] for r in rows if r["session_id"] in ("s4", "s5")}) == 1  # grouped
    assert len({r["tx"] for r in rows}) == 5


async def slots_held_up(
    store: SessionStore, holders: Sequence[Holder], names: TableNames
) -> list[asyncio.Task[None]]:
    """One append alone per slot, each waiting on the lock one of ``holders`` holds."""
    a = appender(store)
    sids = [f"alone{i}" for i in range(a.slots)]
    for h, sid in zip(holders, sids, strict=True):
        await h.hold(names, sid)
    tasks = [asyncio.create_task(store.session(sid).add_items([item(0, 0)])) for sid in sids]
    await until(lambda: saturated(a) and a.alone == 1 + a.slots)  # (the warm-up's first)
    return tasks


def queue(store: SessionStore, sids: Sequence[str]) -> list[asyncio.Task[None]]:
    """One append of one item per session, as tasks."""
    return [asyncio.create_task(store.session(sid).add_items([item(1, 0)])) for sid in sids]


async def test_a_saturated_pool_groups_and_several_groups_fly_at_once(
    pg: Any, names: TableNames
) -> None:
    """Two slots: each frees in turn, sends what queued, and both groups wait on the server."""
    conns = [await outside(pg.url) for _ in range(3)]
    try:
        async with store_on(pg.url, names, 2) as store:
            first, second, z = (Holder(c) for c in conns)
            alone = await slots_held_up(store, [first, second], names)
            await z.hold(names, "z1", "z2")
            a = appender(store)
            one = queue(store, ["z1", "p1", "p2"])
            await until(lambda: len(a._queue) == 3)
            await first.release()  # its slot sends the queue as one group; it waits on "z1"
            await until(lambda: a.groups[3] == 1)
            two = queue(store, ["z2", "q1", "q2"])
            await until(lambda: len(a._queue) == 3)
            await second.release()  # so does the other slot, with what queued since, on "z2"
            await until(lambda: a.groups[3] == 2)
            await until_waiting(conns[0], names, 2, groups=True)  # two groups in flight
            assert a.most_groups_in_flight == 2
            three = queue(store, ["r1", "r2", "r3"])
            await until(lambda: len(a._queue) == 3)  # both slots busy: these queue
            assert not any(t.done() for t in one + two + three)
            await z.release()
            await asyncio.gather(*alone, *one, *two, *three)
        rows = await rows_of(conns[0], names)
    finally:
        for c in conns:
            await c.close()
    assert a.groups == {3: 3}
    by_sid = {r["session_id"]: r["tx"] for r in rows}
    for group in (("z1", "p1", "p2"), ("z2", "q1", "q2"), ("r1", "r2", "r3")):
        assert len({by_sid[sid] for sid in group}) == 1  # one transaction per group
    assert len(set(by_sid.values())) == 5  # two alone, three groups


async def test_a_locked_session_holds_up_only_its_group(pg: Any, names: TableNames) -> None:
    """A group waits on session "z"; the other slot keeps serving everyone else meanwhile.

    16 writers x 4 turns (8 sessions) all land while the group, and so the two other
    batches in it, still wait; they queue and group among themselves on the free slot.
    """
    conns = [await outside(pg.url) for _ in range(3)]
    try:
        async with store_on(pg.url, names, 2) as store:
            first, second, z = (Holder(c) for c in conns)
            alone = await slots_held_up(store, [first, second], names)
            await z.hold(names, "z")
            a = appender(store)
            held = queue(store, ["z", "g1", "g2"])
            await until(lambda: len(a._queue) == 3)
            await second.release()
            await until(lambda: a.groups[3] == 1)  # sent; it waits on "z"
            await first.release()
            await asyncio.gather(*alone)
            await until(lambda: a._in_flight == 1)  # the group's slot only
            writers, turns = 16, 4
            flowing = [asyncio.create_task(writer(store, "o", w, turns)) for w in range(writers)]
            await asyncio.wait_for(asyncio.gather(*flowing), 30)
            assert not any(t.done() for t in held)  # the group still waits on "z"
            # (polled: through a PgBouncer whose pool other clients keep busy, the group's
            # statement may still queue in the pooler after the writers landed)
            await until_waiting(conns[0], names, 1, groups=True)
            landed = await rows_of(conns[0], names)
            await z.release()
            await asyncio.gather(*held)
            await check_turns(store, landed, "o", writers, turns)
        rows = await rows_of(conns[0], names)
    finally:
        for c in conns:
            await c.close()
    assert not {"z", "g1", "g2"} & {r["session_id"] for r in landed}
    assert sum(a.groups.values()) > 1, a.groups  # the writers grouped among themselves too
    assert len({r["tx"] for r in rows if r["session_id"] in ("z", "g1", "g2")}) == 1


def test_legacy_tables_keep_the_single_statement() -> None:
    """No positions, no grouping even when asked for: the legacy runner has no group statement."""
    engine = create_engine(
        "postgresql+asyncpg://u@127.0.0.1:1/none", execution_options={GROUP_COMMIT_OPTION: True}
    )
    names = TableNames("legacy_s", "legacy_m")
    legacy = Postgres.operations(engine, names, "skip", expiry=False)
    head = Postgres.operations(engine, names, "skip", expiry=True)
    assert legacy._runner._appends is None
    assert postgres_groups.GROUP_KEY not in legacy._runner._sql
    assert head._runner._appends is not None


def test_group_parameters_merge_a_session_in_arrival_order() -> None:
    loop = asyncio.new_event_loop()
    try:
        b = [
            postgres_groups._Batch(sid, data, exp, loop.create_future())
            for sid, data, exp in [
                ("b", ["b1", "b2"], None),
                ("a", ["a1"], "t1"),
                ("b", ["b3"], "t2"),
                ("a", ["a2", "a3"], None),
            ]
        ]
    finally:
        loop.close()
    p = postgres_groups.group_params(b)
    assert p["sids"] == ["a", "b"]
    assert p["ns"] == [3, 3]
    assert p["exps"] == ["t1", "t2"]  # the last deadline given, as one write after another
    assert p["owners"] == ["a"] * 3 + ["b"] * 3
    assert p["rows"] == ["a1", "a2", "a3", "b1", "b2", "b3"]
    assert p["backs"] == [2, 1, 0, 2, 1, 0]
