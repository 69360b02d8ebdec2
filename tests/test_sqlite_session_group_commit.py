"""Group commit for the stdlib ``SQLiteSession``: sessions of one process on one file share commits.

The test holds the file's write lock itself (the one every session of the process
on that file takes), so every session's write queues; on release, the first
session to get the lock leads and commits all of them in one transaction. The hold
limit (a time) is lifted so that a loaded machine cannot split the groups counted here.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from agents_memory import SQLiteSession
from agents_memory._databases import sqlite as lite


@pytest.fixture(autouse=True)
def no_hold_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """File locks made during the test group whatever a group's hold (see the last test)."""
    monkeypatch.setattr(lite, "GROUP_MAX_HOLD", math.inf)


def item(w: int, k: int) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": f"w{w} k{k}"}


async def _queued(session: SQLiteSession, n: int) -> None:
    writes = session._file_lock.writes
    for _ in range(4000):
        if writes.pending() == n:
            return
        await asyncio.sleep(0.005)
    msg = "the writes never queued"
    raise AssertionError(msg)


async def test_sessions_on_one_file_share_one_transaction(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    sessions = [SQLiteSession(f"s{w % 8}", path) for w in range(24)]
    try:
        for s in sessions:
            await s.get_items()  # connected (each session has its own thread and connection)
        lock: threading.Lock = sessions[0]._write_lock
        writes = sessions[0]._file_lock.writes
        assert all(s._file_lock.writes is writes for s in sessions)
        batches = [[item(w, k) for k in range(1 + w % 3)] for w in range(24)]
        before, folds = writes.groups, writes.folds
        lock.acquire()
        try:
            tasks = [
                asyncio.create_task(s.add_items(b)) for s, b in zip(sessions, batches, strict=True)
            ]
            await _queued(sessions[0], 24)
        finally:
            lock.release()
        await asyncio.gather(*tasks)
        assert writes.groups - before == 1  # all 24 batches, one transaction
        assert writes.folds - folds == 1  # run together: four statements for the 24
        for w in range(8):
            got = await sessions[w].get_items()
            mine = [batches[v] for v in range(w, 24, 8)]  # three objects: any order between them
            orders = [[i for b in perm for i in b] for perm in itertools.permutations(mine)]
            assert got in orders  # each batch whole and contiguous
        # pops queued together (one object per pop: a session runs one call at a time)
        want = await sessions[0].get_items()
        poppers = [SQLiteSession("s0", path) for _ in range(len(want) + 2)]
        sessions += poppers
        for s in poppers:
            await s.get_items()
        before = writes.groups
        lock.acquire()
        try:
            pops = [asyncio.create_task(s.pop_item()) for s in poppers]
            await _queued(sessions[0], len(poppers))
        finally:
            lock.release()
        popped = await asyncio.gather(*pops)
        assert writes.groups - before == 1
        # each item exactly once (pops saw the ones before them in the group), two found none
        taken = [p for p in popped if p is not None]
        assert sorted(map(repr, taken)) == sorted(map(repr, want))
        assert len(taken) == len(want)
        assert await sessions[0].get_items() == []
    finally:
        for s in sessions:
            s.close()


async def test_a_failing_batch_fails_alone(tmp_path: Path) -> None:
    path = tmp_path / "poison.db"
    good, bad, again = (SQLiteSession(sid, path) for sid in ("good", "bad", "good"))
    try:
        for s in (good, bad, again):
            await s.get_items()
        ddl = sqlite3.connect(path, isolation_level=None)
        ddl.execute(
            f"CREATE TRIGGER refuse_poison BEFORE INSERT ON {good.messages_table} "
            "WHEN NEW.message_data LIKE '%poison%' BEGIN SELECT RAISE(ABORT, 'poison refused'); END"
        )
        ddl.close()
        writes = good._file_lock.writes
        before, unfolded = writes.groups, writes.unfolded
        poison = [item(1, 0), {"type": "message", "role": "user", "content": "poison"}]
        good._write_lock.acquire()
        try:
            tasks = [
                asyncio.create_task(good.add_items([item(0, 0)])),
                asyncio.create_task(bad.add_items(poison)),
                asyncio.create_task(again.add_items([item(0, 1)])),
            ]
            await _queued(good, 3)
        finally:
            good._write_lock.release()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert writes.groups - before == 1
        assert writes.unfolded - unfolded == 1  # the three failed together, then ran alone
        assert results[0] is None
        assert results[2] is None
        assert isinstance(results[1], sqlite3.IntegrityError)
        assert "poison refused" in str(results[1])
        got = await good.get_items()  # two objects, two threads: either may queue first
        assert got in ([item(0, 0), item(0, 1)], [item(0, 1), item(0, 0)])
        assert await bad.get_items() == []
    finally:
        for s in (good, bad, again):
            s.close()


def test_a_leader_past_the_hold_limit_leaves_the_rest_to_their_own_threads(
    tmp_path: Path,
) -> None:
    """Limit 0: a leader commits one batch; each other writer then leads (or is led) in turn."""
    path = tmp_path / "hold.db"
    setup = sqlite3.connect(path, isolation_level=None)
    setup.execute("PRAGMA journal_mode = WAL")
    setup.execute("CREATE TABLE rows (n INTEGER NOT NULL)")
    writes = lite.SharedWrites(max_hold=0.0)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def insert(n: int, conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO rows (n) VALUES (?)", (n,))

    def writer(n: int) -> None:
        conn = lite.open_connection((str(path),), {})
        try:
            writes.run(lock, conn, functools.partial(insert, n))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            conn.close()

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(6)]
    with lock:
        for t in threads:
            t.start()
        while writes.pending() < 6:
            threading.Event().wait(0.005)
    for t in threads:
        t.join(20)
    assert errors == []
    assert writes.groups == 6  # one batch per transaction: the rest were sent back each time
    assert sorted(n for (n,) in setup.execute("SELECT n FROM rows")) == list(range(6))
    setup.close()
