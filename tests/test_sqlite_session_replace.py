"""``SQLiteSession.replace_items`` (stdlib ``sqlite3``): one transaction, old or new history only.

Also the SDK's compaction wrapper over it (atomic through the SDK's hook), the
group-commit path (a replace is one batch among others, in its own savepoint),
and a cancel at random points.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from agents.memory import OpenAIResponsesCompactionSession
from fake_compact_server import FakeCompactServer
from openai import AsyncOpenAI

from agents_memory import SessionStore, SQLiteSession

OLD = [{"role": "user", "content": f"old {i}", "pad": "o" * 60} for i in range(300)]
NEW = [{"role": "assistant", "content": f"new {i}", "pad": "n" * 60} for i in range(200)]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "memory.db"


@pytest.fixture
def server() -> Iterator[FakeCompactServer]:
    s = FakeCompactServer()
    s.start()
    yield s
    s.stop()


@pytest.fixture
async def client(server: FakeCompactServer) -> AsyncIterator[AsyncOpenAI]:
    c = AsyncOpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
    yield c
    await c.close()


@pytest.mark.parametrize("where", ["file", "memory"])
async def test_round_trip_and_bad_input(db: Path, where: str) -> None:
    """The history is swapped in order; a bad item changes nothing."""
    with SQLiteSession("r", db if where == "file" else ":memory:") as s:
        await s.add_items(OLD[:5])  # type: ignore[arg-type]
        await s.replace_items(NEW[:3])  # type: ignore[arg-type]
        assert await s.get_items() == NEW[:3]
        with pytest.raises(TypeError):
            await s.replace_items([{"ok": 1}, "nope"])  # type: ignore[list-item]
        with pytest.raises(ValueError, match=r"NaN|nan|JSON"):
            await s.replace_items([{"x": float("nan")}])
        assert await s.get_items() == NEW[:3]
        await s.replace_items([])
        assert await s.get_items() == []


async def test_same_tables_as_the_store(db: Path) -> None:
    """What the stdlib session replaced, the store reads (metadata and created_at kept)."""
    store = SessionStore.from_url(f"sqlite:///{db}", create_tables=True)
    try:
        await store.session("shared").add_items(OLD[:4])  # type: ignore[arg-type]
        await store.session("shared").set_metadata({"k": "v"})
        before = await store.get_session("shared")
        with SQLiteSession("shared", db) as s:
            await s.replace_items(NEW[:2])  # type: ignore[arg-type]
        after = await store.get_session("shared")
        assert before is not None
        assert after is not None
        assert await store.session("shared").get_items() == NEW[:2]
        assert after.metadata == {"k": "v"}
        assert after.created_at == before.created_at
    finally:
        await store.close()


async def test_replace_among_grouped_writes(db: Path) -> None:
    """Replaces and appends of many sessions on one file at once: each replace whole."""
    sessions = [SQLiteSession(f"g{i}", db) for i in range(6)]
    try:
        for s in sessions:
            await s.add_items(OLD[:20])  # type: ignore[arg-type]

        async def churn(i: int, s: SQLiteSession) -> None:
            for r in range(8):
                if (r + i) % 2:
                    await s.replace_items([{"i": i, "r": r, "k": k} for k in range(10)])
                else:
                    await s.add_items([{"i": i, "r": r, "a": True}])

        await asyncio.gather(*(churn(i, s) for i, s in enumerate(sessions)))
        for i, s in enumerate(sessions):
            items = await s.get_items()
            replaced = [x for x in items if "k" in x]
            rounds = {x["r"] for x in replaced}
            assert len(rounds) == 1  # one replace's items, whole
            assert [x["k"] for x in replaced] == list(range(10))
            assert items[:10] == replaced
            assert all(x["i"] == i for x in items)
    finally:
        for s in sessions:
            s.close()


async def test_cancel_at_random_points_leaves_old_or_new(db: Path) -> None:
    """Cancelled at random moments, a replace leaves exactly the old or the new history."""
    with SQLiteSession("c", db) as s:
        await s.add_items(OLD)  # type: ignore[arg-type]
        started = time.perf_counter()
        await s.replace_items(NEW)  # type: ignore[arg-type]
        seconds = time.perf_counter() - started
        hits = 0
        for trial in range(30):
            await s.replace_items(OLD)  # type: ignore[arg-type]
            task = asyncio.ensure_future(s.replace_items(NEW))  # type: ignore[arg-type]
            await asyncio.sleep(random.uniform(0, seconds))
            hits += not task.done()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            # the worker thread finishes what it started: wait for it through a read
            now = await s.get_items()
            assert now in (OLD, NEW), f"trial {trial}: {len(now)} items"
        assert hits > 0


async def test_sdk_compaction_is_atomic_over_it(
    db: Path, client: AsyncOpenAI, server: FakeCompactServer
) -> None:
    """The SDK's compaction wrapper swaps the history through the hook; readers see old or new."""
    server.delay = 0.02
    with SQLiteSession("cmp", db) as s, SQLiteSession("cmp", db) as reader_view:
        wrapper = OpenAIResponsesCompactionSession("cmp", s, client=client, model="gpt-4.1")
        bad = reads = 0
        for round_ in range(3):
            await s.replace_items(
                [{"role": "user", "content": f"{round_}.{k}"} for k in range(1200)]
            )
            old = await s.get_items()
            stop = asyncio.Event()

            async def reader(old: list[Any] = old, stop: asyncio.Event = stop) -> None:
                nonlocal bad, reads
                while not stop.is_set():
                    seen = await reader_view.get_items()
                    reads += 1
                    bad += seen != old and [i.get("type") for i in seen] != [
                        "message",
                        "compaction",
                    ]
                    await asyncio.sleep(0)

            task = asyncio.create_task(reader())
            await wrapper.run_compaction({"force": True})
            stop.set()
            await task
            assert [i["type"] for i in await s.get_items()] == ["message", "compaction"]
        assert reads > 0
        assert bad == 0
