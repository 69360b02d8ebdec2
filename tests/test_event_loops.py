"""Several event loops in several threads (web workers calling ``asyncio.run``) on one store.

The process-wide locks (one migration at a time, one schema check per engine) are
thread locks awaited without blocking, so they are bound to no loop.
"""

from __future__ import annotations

import asyncio
import gc
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from agents_memory import SQLAlchemySession, TableNames
from agents_memory._codec import encode_items
from agents_memory._locking import LoopSpanningLock


def _in_threads(count: int, job: Any) -> list[Any]:
    """Run ``job(i)`` in ``count`` threads, each under its own ``asyncio.run``; return results."""
    results: list[Any] = [None] * count
    start = threading.Barrier(count)

    def run(i: int) -> None:
        async def main() -> Any:
            return await job(i, start)

        try:
            results[i] = asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread never returned"
    return results


def test_two_loops_in_two_threads_create_and_write_one_file(tmp_path: Path) -> None:
    """Two from_url(create_tables=True) sessions, one per thread and loop, both succeed at once."""
    for attempt in range(3):
        url = f"sqlite:///{tmp_path / f'fresh-{attempt}.db'}"

        async def job(i: int, start: threading.Barrier, url: str = url) -> tuple[list[Any], float]:
            async with SQLAlchemySession.from_url(f"s{i}", url=url, create_tables=True) as s:
                start.wait()
                began = time.perf_counter()
                item = {"role": "user", "content": f"from thread {i}"}
                await asyncio.wait_for(s.add_items([item]), 10)
                return await s.get_items(), time.perf_counter() - began

        results = _in_threads(2, job)
        for i, result in enumerate(results):
            assert not isinstance(result, BaseException), result
            items, took = result
            assert items == [{"role": "user", "content": f"from thread {i}"}]
            assert took < 5


def test_one_session_from_loops_in_threads(tmp_path: Path) -> None:
    """One session object used under three loops at once on a fresh file: every write lands."""
    path = tmp_path / "shared.db"
    session = SQLAlchemySession.from_url("one", url=f"sqlite:///{path}", create_tables=True)

    async def job(i: int, start: threading.Barrier) -> None:
        start.wait()
        await asyncio.wait_for(session.add_items([{"n": i}]), 10)

    try:
        results = _in_threads(3, job)
        assert results == [None, None, None]
    finally:
        asyncio.run(session.close())
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT message_data FROM agent_messages").fetchall()
    assert sorted(rows) == [(encode_items([{"n": i}])[0],) for i in range(3)]


def test_every_database_from_loops_in_threads(file_backend: Any, names: TableNames) -> None:
    """On every database: two threads, each with its own loop, create the tables and write."""
    tables = {"sessions_table": names.sessions, "messages_table": names.messages}

    async def job(i: int, start: threading.Barrier) -> list[Any]:
        url = file_backend.url
        async with SQLAlchemySession.from_url(f"t{i}", url=url, create_tables=True, **tables) as s:
            start.wait()
            await asyncio.wait_for(s.add_items([{"n": i}]), 20)
            return await s.get_items()

    results = _in_threads(2, job)
    assert results == [[{"n": 0}], [{"n": 1}]]


def test_a_lock_held_by_a_closed_loop_is_free_again() -> None:
    """A holder abandoned when its loop closed does not stall later loops; live holders do."""
    lock = LoopSpanningLock()
    abandoned = asyncio.new_event_loop()
    entered = asyncio.Event()

    async def hold_forever() -> None:
        async with lock.hold():
            entered.set()
            await asyncio.sleep(3600)

    task = abandoned.create_task(hold_forever())
    abandoned.run_until_complete(entered.wait())
    abandoned.close()  # the task is left pending: its finally never runs
    assert not task.done()

    async def take(within: float) -> bool:
        try:
            async with asyncio.timeout(within), lock.hold():
                return True
        except TimeoutError:
            return False

    assert asyncio.run(take(5))

    async def held_elsewhere() -> bool:
        async with lock.hold():
            # The abandoned holder, collected now, runs its finally: that must not
            # release the lock its loop no longer owns.
            nonlocal task, abandoned
            del task, abandoned
            gc.collect()
            return await asyncio.to_thread(asyncio.run, take(0.2))

    assert asyncio.run(held_elsewhere()) is False
    assert asyncio.run(take(1))
