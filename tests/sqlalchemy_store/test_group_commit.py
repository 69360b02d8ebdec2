"""Group commit on SQLite: batches queued behind a commit share the next transaction.

Every test makes the grouping certain rather than likely: an outside connection
holds the file's write lock (as another process would), so the writer thread
waits in ``BEGIN IMMEDIATE`` with the first batch while the others queue; when
the lock is released, the first batch commits alone and everything queued behind
it goes into one transaction. The writer's count of transactions proves it.

The hold limit (``GROUP_MAX_HOLD``, a time) is lifted for these tests (``no_hold_limit``)
so that a loaded machine cannot split a group the test counts; its own tests set it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import math
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from group_waits import item, until
from sqlalchemy import exc as sa_exc
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory import SessionStore, create_engine
from agents_memory._databases import sqlite as lite
from agents_memory._databases.base import GROUP_COMMIT_OPTION
from agents_memory.models import get_models


async def _store(engine: AsyncEngine, tmp_path: Path) -> SessionStore:
    del tmp_path
    s = SessionStore(
        engine, sessions_table="gc_sessions", messages_table="gc_messages", create_tables=True
    )
    await s.session("warm").add_items([item(-1, 0)])  # schema checked: writes take the driver path
    return s


@pytest.fixture(autouse=True)
def no_hold_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writers made during the test keep taking batches however long a group holds the lock."""
    monkeypatch.setattr(lite, "GROUP_MAX_HOLD", math.inf)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SessionStore]:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'gc.db'}")
    s = await _store(engine, tmp_path)
    yield s
    await s.close()
    await engine.dispose()


def writer_of(store: SessionStore) -> lite.GroupWriter:
    return lite._threads_for(store.engine).writer


class Stall:
    """An outside connection holding the file's write lock, with our writer waiting on it."""

    def __init__(self, store: SessionStore) -> None:
        path = store.engine.url.database
        assert path
        self.blocker = sqlite3.connect(path, isolation_level=None)
        self.writer = writer_of(store)
        self.store = store
        self.first: asyncio.Task[None] | None = None
        self.groups_before = 0

    async def start(self) -> None:
        """Take the lock, then send one batch that the writer takes and waits with in BEGIN."""
        self.blocker.execute("BEGIN IMMEDIATE")
        self.groups_before = self.writer.groups
        self.first = asyncio.create_task(self.store.session("first").add_items([item(0, 0)]))
        await until(lambda: self.writer.groups == self.groups_before + 1)
        assert self.writer.pending() == 0  # taken: the writer is waiting for the lock

    async def queued(self, n: int) -> None:
        """Wait until ``n`` batches queue behind the stalled one."""
        await until(lambda: self.writer.pending() == n)

    def release(self) -> None:
        """Let the writer have the lock."""
        self.blocker.execute("COMMIT")

    def groups(self) -> int:
        """Transactions the writer started since :meth:`start` (the stalled one included)."""
        return self.writer.groups - self.groups_before

    def close(self) -> None:
        """Release the lock (if still held) and close the outside connection."""
        if self.blocker.in_transaction:
            self.blocker.execute("ROLLBACK")
        self.blocker.close()


@pytest.fixture
async def stall(store: SessionStore) -> AsyncIterator[Stall]:
    st = Stall(store)
    try:
        await st.start()
        yield st
    finally:
        st.close()


@pytest.fixture
async def stall_later(store: SessionStore) -> AsyncIterator[Stall]:
    """A stall set up by the test itself (after its own preparatory writes)."""
    st = Stall(store)
    try:
        yield st
    finally:
        st.close()


def refuse_items_with(store: SessionStore, word: str, raise_args: str) -> None:
    """A trigger, made by another connection: ``RAISE(raise_args)`` on an item holding ``word``."""
    path = store.engine.url.database
    assert path
    ddl = sqlite3.connect(path, isolation_level=None)
    ddl.execute(
        f"CREATE TRIGGER refuse_{word} BEFORE INSERT ON {store.table_names.messages} "
        f"WHEN NEW.message_data LIKE '%{word}%' BEGIN SELECT RAISE({raise_args}); END"
    )
    ddl.close()


async def test_queued_batches_share_one_transaction_whole_and_in_order(
    store: SessionStore, stall: Stall
) -> None:
    """30 sessions plus 10 calls on one shared session: one transaction, each batch contiguous."""
    batches = {w: [item(w, k) for k in range(1 + w % 5)] for w in range(40)}
    tasks = [
        asyncio.create_task(store.session(f"s{w}" if w < 30 else "shared").add_items(batches[w]))
        for w in range(40)
    ]
    folds = stall.writer.folds
    await stall.queued(40)
    stall.release()
    await asyncio.gather(*tasks)
    assert stall.first is not None
    await stall.first
    assert stall.groups() == 2  # the stalled batch alone, then all 40 together
    assert stall.writer.folds == folds + 1  # in one run: four statements for the 40
    for w in range(30):
        assert await store.session(f"s{w}").get_items() == batches[w]
    shared = await store.session("shared").get_items()
    assert shared == [i for w in range(30, 40) for i in batches[w]]  # arrival order, contiguous


async def test_grouped_pops_take_each_item_exactly_once(
    store: SessionStore, stall_later: Stall
) -> None:
    """25 pops queued together on 20 items: each item once, newest first, then None."""
    s = store.session("pops")
    items = [item(1, k) for k in range(20)]
    await s.add_items(items)
    stall = stall_later
    await stall.start()
    pops = [asyncio.create_task(s.pop_item()) for _ in range(25)]
    await stall.queued(25)
    stall.release()
    results = await asyncio.gather(*pops)
    assert stall.groups() == 2
    assert results == [*reversed(items), *[None] * 5]  # each pop saw the earlier ones
    assert await s.get_items() == []


async def test_grouped_adds_clear_and_pop_run_in_arrival_order(
    store: SessionStore, stall: Stall
) -> None:
    s = store.session("mixed")
    steps = [
        asyncio.create_task(s.add_items([item(2, 0), item(2, 1)])),
        asyncio.create_task(s.clear_session()),
        asyncio.create_task(s.add_items([item(3, 0), item(3, 1)])),
        asyncio.create_task(s.pop_item()),
    ]
    await stall.queued(4)
    stall.release()
    results = await asyncio.gather(*steps)
    assert stall.groups() == 2
    assert results[3] == item(3, 1)
    assert await s.get_items() == [item(3, 0)]


async def test_a_failing_batch_rolls_back_alone_and_only_its_caller_sees_the_error(
    store: SessionStore,
) -> None:
    """A trigger refuses one batch inside a group: the others commit, its caller gets the error."""
    refuse_items_with(store, "poison", "ABORT, 'poison refused'")
    st = Stall(store)
    try:
        await st.start()
        good = [item(4, k) for k in range(3)]
        poison = [item(5, 0), {"type": "message", "role": "user", "content": "poison"}]
        tasks = [
            asyncio.create_task(store.session("a").add_items(good)),
            asyncio.create_task(store.session("a").add_items(poison)),
            asyncio.create_task(store.session("b").add_items(poison)),
            asyncio.create_task(store.session("a").add_items(good[:1])),
            asyncio.create_task(store.session("c").add_items(good)),
        ]
        unfolded = st.writer.unfolded
        await st.queued(5)
        st.release()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert st.groups() == 2
        assert st.writer.unfolded == unfolded + 1  # the five failed together, then ran alone
    finally:
        st.close()
    assert [r is None for r in results] == [True, False, False, True, True]
    for failed in (results[1], results[2]):
        assert isinstance(failed, sa_exc.IntegrityError)
        assert "poison refused" in str(failed)
    assert await store.session("a").get_items() == good + good[:1]  # item(5, 0) rolled back too
    assert await store.session("b").get_items() == []
    assert await store.session("c").get_items() == good
    assert await store.get_session("b") is None  # its session row was in the rolled-back savepoint


async def test_a_folded_run_starts_expired_sessions_afresh_and_renews_every_deadline(
    tmp_path: Path,
) -> None:
    """Appends run together keep each one's TTL rules: an expired session loses its old items.

    "old" expired (behind the store's back) holding two items; it is appended to
    twice in the run, beside a live session and a new one. The first append starts
    it afresh (its old rows deleted, not just hidden), the second lands after it.
    """
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'gc.db'}")
    store = SessionStore(
        engine,
        sessions_table="gc_sessions",
        messages_table="gc_messages",
        create_tables=True,
        ttl=dt.timedelta(hours=1),
    )
    st = Stall(store)
    try:
        for sid in ("old", "live"):
            await store.session(sid).add_items([item(20, 0), item(20, 1)])
        sessions = get_models(store.table_names).Session.__table__
        async with engine.begin() as conn:
            await conn.execute(
                update(sessions)
                .where(sessions.c.session_id == "old")
                .values(expires_at=dt.datetime(2000, 1, 1, tzinfo=dt.UTC).replace(tzinfo=None))
            )
        assert await store.session("old").get_items() == []  # expired: reads see nothing
        await st.start()
        folds, before = st.writer.folds, dt.datetime.now(dt.UTC).replace(tzinfo=None)
        tasks = [
            asyncio.create_task(store.session(sid).add_items(batch))
            for sid, batch in (
                ("old", [item(21, 0), item(21, 1)]),
                ("live", [item(22, 0)]),
                ("old", [item(23, 0)]),
                ("new", [item(24, 0)]),
            )
        ]
        await st.queued(4)
        st.release()
        await asyncio.gather(*tasks)
        assert st.groups() == 2
        assert st.writer.folds == folds + 1
    finally:
        st.close()
    try:
        assert await store.session("old").get_items() == [item(21, 0), item(21, 1), item(23, 0)]
        assert await store.session("live").get_items() == [item(20, 0), item(20, 1), item(22, 0)]
        assert await store.session("new").get_items() == [item(24, 0)]
        messages = get_models(store.table_names).Message.__table__
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(messages.c.position)
                    .where(messages.c.session_id == "old")
                    .order_by(messages.c.position)
                )
            ).scalars()
            assert list(rows) == [3, 4, 5]  # the old two are gone; positions go on, contiguous
        for sid in ("old", "live", "new"):
            deadline = await store.session(sid).expires_at()
            assert deadline is not None
            assert deadline >= before + dt.timedelta(minutes=59)  # renewed by the run's writes
    finally:
        await store.close()
        await engine.dispose()


async def test_appends_to_two_table_sets_fold_per_table_set_in_arrival_order(
    tmp_path: Path,
) -> None:
    """Two stores on one engine share its writer: a run folds only one table set's appends."""
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'gc.db'}")
    first = await _store(engine, tmp_path)
    other = SessionStore(
        engine, sessions_table="gc2_sessions", messages_table="gc2_messages", create_tables=True
    )
    await other.session("warm").add_items([item(-1, 0)])
    st = Stall(first)
    try:
        await st.start()
        folds = st.writer.folds
        plan = [(first, "s1"), (first, "s2"), (other, "s1"), (other, "s1"), (first, "s1")]
        tasks = [
            asyncio.create_task(store.session(sid).add_items([item(30 + w, 0), item(30 + w, 1)]))
            for w, (store, sid) in enumerate(plan)
        ]
        await st.queued(5)
        st.release()
        await asyncio.gather(*tasks)
        assert st.groups() == 2
        assert st.writer.folds == folds + 2  # [first, first], [other, other], then one alone
    finally:
        st.close()
    try:
        landed = [item(30, 0), item(30, 1), item(34, 0), item(34, 1)]
        assert await first.session("s1").get_items() == landed
        assert await first.session("s2").get_items() == [item(31, 0), item(31, 1)]
        assert await other.session("s1").get_items() == [
            item(32, 0),
            item(32, 1),
            item(33, 0),
            item(33, 1),
        ]
        assert await other.session("s2").get_items() == []
    finally:
        await other.close()
        await first.close()
        await engine.dispose()


async def test_appends_run_together_up_to_the_fold_byte_limit(
    store: SessionStore, stall: Stall, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Runs stop at ``FOLD_MAX_BYTES`` (the hold limit is checked between them): 2 + 2 + 1."""
    turn = [[{"type": "message", "role": "user", "content": f"{w}" * 1000}] for w in range(5)]
    monkeypatch.setattr(lite, "FOLD_MAX_BYTES", 2 * 1100)  # two such batches, not three
    folds = stall.writer.folds
    tasks = [asyncio.create_task(store.session(f"f{w}").add_items(turn[w])) for w in range(5)]
    await stall.queued(5)
    stall.release()
    await asyncio.gather(*tasks)
    assert stall.groups() == 2
    assert stall.writer.folds == folds + 2  # the fifth ran alone, in its own savepoint
    for w in range(5):
        assert await store.session(f"f{w}").get_items() == turn[w]


async def test_a_folded_run_that_loses_the_transaction_fails_only_its_own_callers(
    store: SessionStore,
) -> None:
    """A trigger rolls back the whole transaction inside a run: its appends get the error.

    The batches queued after the run never joined it: they go back to the queue
    and commit in the next transaction (the pop takes its item exactly once).
    """
    await store.session("p").add_items([item(40, 0)])
    refuse_items_with(store, "doom", "ROLLBACK, 'doomed'")  # the whole transaction
    st = Stall(store)
    try:
        await st.start()
        unfolded = st.writer.unfolded
        doomed = {"type": "message", "role": "user", "content": "doom"}
        tasks = [
            asyncio.create_task(store.session("a").add_items([item(41, 0)])),
            asyncio.create_task(store.session("b").add_items([doomed])),
            asyncio.create_task(store.session("p").pop_item()),
            asyncio.create_task(store.session("c").add_items([item(42, 0)])),
        ]
        await st.queued(4)
        st.release()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert st.groups() == 3  # the stalled batch, the lost one, the pop and "c"
        assert st.writer.unfolded == unfolded + 1
    finally:
        st.close()
    for failed in results[:2]:
        assert isinstance(failed, sa_exc.IntegrityError)
        assert "doomed" in str(failed)
    assert results[2] == item(40, 0)
    assert results[3] is None
    assert await store.session("a").get_items() == []
    assert await store.session("b").get_items() == []
    assert await store.session("p").get_items() == []
    assert await store.session("c").get_items() == [item(42, 0)]


def _deferred_fk_violation(messages: str) -> Callable[[sqlite3.Connection], None]:
    """A job whose statements succeed but whose transaction cannot commit (checked at COMMIT)."""

    def job(conn: sqlite3.Connection) -> None:
        conn.execute("PRAGMA defer_foreign_keys = ON")
        conn.execute(
            f"INSERT INTO {messages} (session_id, position, message_data, created_at) "
            "VALUES ('no such session', 1, '{}', '2026-01-01 00:00:00')"
        )

    return job


async def test_a_failed_commit_reaches_exactly_the_callers_in_that_group(
    store: SessionStore, stall: Stall
) -> None:
    """COMMIT itself fails (a deferred foreign key): every batch of that group, and no other."""
    writer = stall.writer
    a = asyncio.create_task(store.session("a").add_items([item(6, 0)]))
    await stall.queued(1)
    doomed = asyncio.create_task(writer.call(_deferred_fk_violation(store.table_names.messages)))
    b = asyncio.create_task(store.session("b").add_items([item(7, 0)]))
    await stall.queued(3)
    stall.release()
    assert stall.first is not None
    await stall.first  # the stalled batch, committed alone before the doomed group
    results = await asyncio.gather(a, b, doomed, return_exceptions=True)
    assert stall.groups() == 2
    assert isinstance(results[0], sa_exc.IntegrityError)
    assert isinstance(results[1], sa_exc.IntegrityError)
    assert isinstance(results[2], sqlite3.IntegrityError)
    assert await store.session("first").get_items() == [item(0, 0)]
    assert await store.session("a").get_items() == []
    assert await store.session("b").get_items() == []
    await store.session("a").add_items([item(6, 1)])  # the writer goes on
    assert await store.session("a").get_items() == [item(6, 1)]


async def test_cancelled_before_joining_never_runs(store: SessionStore, stall: Stall) -> None:
    """Cancelled while queued, and while its transaction waits for the lock: withdrawn at once."""
    queued = asyncio.create_task(store.session("q").add_items([item(8, 0)]))
    await stall.queued(1)
    queued.cancel()
    assert stall.first is not None
    stall.first.cancel()  # taken into a transaction still waiting in BEGIN IMMEDIATE
    for task in (queued, stall.first):
        with pytest.raises(asyncio.CancelledError):
            await task  # raised while the lock is still held: nothing waited for the writer
    assert stall.blocker.in_transaction
    stall.release()
    await store.session("after").add_items([item(9, 0)])
    assert await store.session("q").get_items() == []
    assert await store.session("first").get_items() == []
    assert await store.session("after").get_items() == [item(9, 0)]
    assert stall.groups() == 2  # the stalled one (empty, committed), then "after": "q" never ran


async def test_cancelled_after_joining_settles_once_the_group_committed(
    store: SessionStore, stall: Stall
) -> None:
    """A batch that ran in its savepoint: the cancel waits for the group's COMMIT, then raises."""
    started, go_on = threading.Event(), threading.Event()

    def slow(_conn: sqlite3.Connection) -> None:
        started.set()
        assert go_on.wait(20)

    joined = asyncio.create_task(store.session("j").add_items([item(10, 0), item(10, 1)]))
    await stall.queued(1)
    slow_done = asyncio.create_task(stall.writer.call(slow))  # after "j" in the same group
    await stall.queued(2)
    stall.release()
    await until(started.is_set)  # "j" has run in its savepoint; the group has not committed
    joined.cancel()
    for _ in range(20):
        await asyncio.sleep(0)
    assert not joined.done()  # held until the group has finished
    joined.cancel()  # a second cancel while it waits: still held
    for _ in range(20):
        await asyncio.sleep(0)
    assert not joined.done()
    go_on.set()
    with pytest.raises(asyncio.CancelledError):
        await joined
    await slow_done
    assert stall.groups() == 2
    assert await store.session("j").get_items() == [item(10, 0), item(10, 1)]


async def test_a_group_stops_at_its_batch_limit(store: SessionStore, stall: Stall) -> None:
    n = lite.GROUP_MAX_BATCHES + 6
    tasks = [asyncio.create_task(store.session(f"n{w}").add_items([item(w, 0)])) for w in range(n)]
    await stall.queued(n)
    stall.release()
    await asyncio.gather(*tasks)
    assert stall.groups() == 3  # stalled one, a full group, the rest
    for w in (0, n - 1):
        assert await store.session(f"n{w}").get_items() == [item(w, 0)]


async def test_a_group_stops_at_its_byte_limit(store: SessionStore, stall: Stall) -> None:
    third = lite.GROUP_MAX_BYTES // 3 + 1  # two fit in a group, three do not
    big = [[{"type": "message", "role": "user", "content": str(w) * third}] for w in range(4)]
    tasks = [asyncio.create_task(store.session(f"big{w}").add_items(big[w])) for w in range(4)]
    await stall.queued(4)
    stall.release()
    await asyncio.gather(*tasks)
    assert stall.groups() == 3  # stalled one, then two groups of two
    assert await store.session("big3").get_items() == big[3]


async def test_group_commit_can_be_turned_off(tmp_path: Path) -> None:
    """``execution_options={"agents_memory_group_commit": False}``: one transaction per batch."""
    engine = create_engine(
        f"sqlite+aiosqlite:///{tmp_path / 'off.db'}",
        execution_options={GROUP_COMMIT_OPTION: False},
    )
    s = await _store(engine, tmp_path)
    try:
        assert not writer_of(s).grouped
        st = Stall(s)
        try:
            await st.start()
            tasks = [
                asyncio.create_task(s.session(f"o{w}").add_items([item(w, 0)])) for w in range(5)
            ]
            await st.queued(5)
            st.release()
            await asyncio.gather(*tasks)
            assert st.groups() == 6
        finally:
            st.close()
        assert await s.session("o4").get_items() == [item(4, 0)]
    finally:
        await s.close()
        await engine.dispose()
    on = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'on.db'}")
    s = await _store(on, tmp_path)
    try:
        assert writer_of(s).grouped  # on by default
    finally:
        await s.close()
        await on.dispose()


class _Rows:
    """A bare table written by raw jobs on a writer of our own (its hold limit chosen)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.blocker = sqlite3.connect(path, isolation_level=None)
        self.blocker.execute("PRAGMA journal_mode = WAL")
        self.blocker.execute("CREATE TABLE rows (n INTEGER NOT NULL)")

    def writer(self, max_hold: float) -> lite.GroupWriter:
        connect = functools.partial(lite.open_connection, (str(self.path),), {})
        return lite.GroupWriter(connect, "test-writer", max_hold=max_hold)

    def values(self) -> list[int]:
        return [n for (n,) in self.blocker.execute("SELECT n FROM rows ORDER BY rowid")]


def _insert(
    n: int, before: Callable[[], None] = lambda: None
) -> Callable[[sqlite3.Connection], int]:
    def job(conn: sqlite3.Connection) -> int:
        before()
        conn.execute("INSERT INTO rows (n) VALUES (?)", (n,))
        return n

    return job


async def test_a_group_past_its_hold_limit_sends_the_rest_back_unjoined(tmp_path: Path) -> None:
    """Held past the limit, a group commits what ran; the rest lead the next, and may withdraw.

    Limit 0: every group runs one batch. The first batch of the taken group blocks
    until the test has cancelled a later one of the same group: that one was taken
    but never joined, so its cancel is raised at once and it never runs.
    """
    rows = _Rows(tmp_path / "hold.db")
    writer = rows.writer(max_hold=0.0)
    started, go_on = threading.Event(), threading.Event()

    def block() -> None:
        started.set()
        assert go_on.wait(20)

    try:
        rows.blocker.execute("BEGIN IMMEDIATE")  # the writer waits in BEGIN with batch 0
        first = asyncio.create_task(writer.call(_insert(0)))
        await until(lambda: writer.groups == 1 and writer.pending() == 0)
        tasks = [
            asyncio.create_task(writer.call(_insert(n, block if n == 1 else lambda: None)))
            for n in (1, 2, 3, 4)
        ]
        await until(lambda: writer.pending() == 4)
        rows.blocker.execute("COMMIT")
        await until(started.is_set)  # batch 1 runs: its group (1-4) was taken whole
        assert writer.groups == 2
        assert writer.pending() == 0
        tasks[2].cancel()  # batch 3: taken, not joined
        with pytest.raises(asyncio.CancelledError):
            await tasks[2]
        assert not tasks[0].done()  # raised while the group still ran batch 1
        go_on.set()
        assert await asyncio.gather(first, tasks[0], tasks[1], tasks[3]) == [0, 1, 2, 4]
        assert writer.groups == 4  # 0 | 1 (then 2-4 sent back) | 2 (3 withdrawn) | 4
        assert rows.values() == [0, 1, 2, 4]
        assert len(writer.holds()) == 4
    finally:
        go_on.set()
        writer.stop(wait=True)
        rows.blocker.close()


async def test_within_its_hold_limit_a_group_takes_everything_queued(tmp_path: Path) -> None:
    """The same queue with no hold limit: the batches behind the stalled one share one group."""
    rows = _Rows(tmp_path / "nohold.db")
    writer = rows.writer(max_hold=math.inf)
    try:
        rows.blocker.execute("BEGIN IMMEDIATE")
        first = asyncio.create_task(writer.call(_insert(0)))
        await until(lambda: writer.groups == 1 and writer.pending() == 0)
        tasks = [asyncio.create_task(writer.call(_insert(n))) for n in (1, 2, 3, 4)]
        await until(lambda: writer.pending() == 4)
        rows.blocker.execute("COMMIT")
        assert await asyncio.gather(first, *tasks) == [0, 1, 2, 3, 4]
        assert writer.groups == 2
        assert rows.values() == [0, 1, 2, 3, 4]
    finally:
        writer.stop(wait=True)
        rows.blocker.close()


class _Wakes:
    """Counts a loop's ``call_soon_threadsafe`` calls (each one a wake-up from a thread)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.count = 0
        self._real = loop.call_soon_threadsafe

    def __enter__(self):
        def counting(*args, **kwargs):
            self.count += 1
            return self._real(*args, **kwargs)

        self.loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        del self.loop.call_soon_threadsafe


async def test_outcomes_finished_before_the_loop_runs_share_one_wake_up(
    store: SessionStore,
) -> None:
    """Reads finished while the loop is busy reach it with one wake-up (one each before: 21).

    The reader thread is held inside a job of ours so that 20 reads certainly queue
    behind it; then the loop's own thread is blocked (as a loop busy with other
    callers is) until a last job of ours shows the reader has run them all. A read
    cancelled while queued is withdrawn and never runs; the others get their items.
    """
    for k in range(20):
        await store.session(f"r{k}").add_items([item(k, 0), item(k, 1)])
    reader = lite._threads_for(store.engine).reader
    loop = asyncio.get_running_loop()
    held, release, ran_all = threading.Event(), threading.Event(), threading.Event()

    def hold(_conn: sqlite3.Connection) -> str:
        held.set()
        release.wait(20)
        return "held"

    holder = asyncio.create_task(reader.call(hold))
    await until(held.is_set, "the reader thread")
    reads = [asyncio.create_task(store.session(f"r{k}").get_items()) for k in range(20)]
    withdrawn = asyncio.create_task(store.session("r0").get_items(limit=1))
    await until(lambda: reader._jobs.qsize() == 21, "the reads queueing")
    withdrawn.cancel()
    await asyncio.sleep(0)  # the cancelled task withdraws its job
    last = asyncio.create_task(reader.call(lambda _conn: ran_all.set()))
    await until(lambda: reader._jobs.qsize() == 22, "the last job queueing")
    with _Wakes(loop) as wakes:
        release.set()
        assert ran_all.wait(20)  # (the loop's thread blocked: nothing is delivered meanwhile)
        assert await holder == "held"
        got = await asyncio.gather(*reads)
        await last
    assert got == [[item(k, 0), item(k, 1)] for k in range(20)]
    assert wakes.count == 1
    with pytest.raises(asyncio.CancelledError):
        await withdrawn


async def test_a_finished_read_is_not_held_back_by_a_long_job_behind_it(
    store: SessionStore,
) -> None:
    """A read that has run is delivered while the long job queued behind it still runs."""
    await store.session("short").add_items([item(0, 0)])
    reader = lite._threads_for(store.engine).reader
    held, release, go = threading.Event(), threading.Event(), threading.Event()

    def hold(_conn: sqlite3.Connection) -> None:
        held.set()
        release.wait(20)

    def long_job(_conn: sqlite3.Connection) -> str:
        go.wait(20)
        return "long"

    holder = asyncio.create_task(reader.call(hold))
    await until(held.is_set, "the reader thread")
    short = asyncio.create_task(store.session("short").get_items())
    await until(lambda: reader._jobs.qsize() == 1, "the read queueing")
    long = asyncio.create_task(reader.call(long_job))
    await until(lambda: reader._jobs.qsize() == 2, "the long job queueing")
    release.set()
    try:
        assert await asyncio.wait_for(short, 10) == [item(0, 0)]
        assert not long.done()  # still running: the read did not wait for it
    finally:
        go.set()
    assert await long == "long"
    await holder
