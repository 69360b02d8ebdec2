"""Nothing lost under concurrency: many writers, many poppers, several processes."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from typing import Any

from sqlalchemy import select

from agents_memory import SessionStore, get_models
from agents_memory._codec import encode_items


async def stored(store: SessionStore, session_id: str) -> tuple[list[tuple[int, str]], int]:
    """``([(position, message_data), ...] by position, the session's last_position)``."""
    models = get_models(store.table_names)
    m, s = models.Message.__table__, models.Session.__table__
    async with store.engine.connect() as conn:
        rows = (
            await conn.execute(
                select(m.c.position, m.c.message_data)
                .where(m.c.session_id == session_id)
                .order_by(m.c.position)
            )
        ).all()
        top = (
            await conn.execute(select(s.c.last_position).where(s.c.session_id == session_id))
        ).scalar_one()
    return [(int(p), str(d)) for p, d in rows], int(top)


def assert_batches_contiguous(items: list[dict[str, Any]], writers: int, batches: int, size: int):
    """Check every item is present once and each batch is contiguous and in order.

    Each writer's batches must also appear in the order it wrote them.
    """
    assert len(items) == writers * batches * size
    keys = [(i["w"], i["b"], i["k"]) for i in items]
    assert len(set(keys)) == len(keys)
    for start in range(0, len(items), size):
        chunk = items[start : start + size]
        assert {(i["w"], i["b"]) for i in chunk} == {(chunk[0]["w"], chunk[0]["b"])}
        assert [i["k"] for i in chunk] == list(range(size))
    for w in range(writers):
        assert [i["b"] for i in items if i["w"] == w and i["k"] == 0] == list(range(batches))


async def test_concurrent_writers_one_session(store: SessionStore) -> None:
    """40 tasks appending batches to one session lose nothing and never interleave a batch."""
    writers, batches, size = 40, 5, 4

    async def writer(w: int) -> None:
        s = store.session("shared")
        for b in range(batches):
            await s.add_items([{"w": w, "b": b, "k": k} for k in range(size)])

    await asyncio.gather(*(writer(w) for w in range(writers)))
    items = await store.session("shared").get_items()
    assert_batches_contiguous(items, writers, batches, size)
    # the positions the session's counter handed out: unique, gap-free, one run per batch
    rows, top = await stored(store, "shared")
    total = writers * batches * size
    assert [p for p, _ in rows] == list(range(1, total + 1))
    assert top == total
    for start in range(0, total, size):
        batch = {str(i["w"]) + "/" + str(i["b"]) for i in items[start : start + size]}
        assert len(batch) == 1  # positions start+1 to start+size hold one batch


async def test_concurrent_writers_many_sessions(store: SessionStore) -> None:
    """Writers on separate sessions each see exactly their own items, in order."""

    async def writer(w: int) -> None:
        s = store.session(f"s{w}")
        for b in range(5):
            await s.add_items([{"w": w, "b": b}])

    await asyncio.gather(*(writer(w) for w in range(32)))
    for w in range(32):
        assert await store.session(f"s{w}").get_items() == [{"w": w, "b": b} for b in range(5)]


async def test_concurrent_pops_claim_each_item_once(store: SessionStore) -> None:
    """16 concurrent poppers drain 300 items: each item is returned exactly once."""
    s = store.session("q")
    await s.add_items([{"n": n} for n in range(300)])
    popped: list[int] = []

    async def popper() -> None:
        while (item := await store.session("q").pop_item()) is not None:
            popped.append(item["n"])

    await asyncio.gather(*(popper() for _ in range(16)))
    assert sorted(popped) == list(range(300))
    assert await s.get_items() == []
    rows, top = await stored(store, "q")
    assert rows == []
    assert top == 300  # the counter never goes back: a popped position is not handed out again
    await s.add_items([{"n": "next"}])
    assert (await stored(store, "q"))[0] == [(301, encode_items([{"n": "next"}])[0])]
    assert encode_items([{"n": "next"}])[0].rstrip() == '{"n":"next"}'


async def test_mixed_readers_writers_and_poppers(store: SessionStore) -> None:
    """Reads during writes always see whole batches, in order."""
    s = store.session("mix")
    stop = asyncio.Event()
    seen_bad: list[Any] = []

    async def writer(w: int) -> None:
        for b in range(10):
            await store.session("mix").add_items([{"w": w, "b": b, "k": k} for k in range(3)])

    async def reader() -> None:
        while not stop.is_set():
            items = await store.session("mix").get_items()
            for start in range(0, len(items), 3):
                chunk = items[start : start + 3]
                if [i["k"] for i in chunk] != [0, 1, 2]:
                    seen_bad.append(chunk)
            await asyncio.sleep(0)

    readers = [asyncio.create_task(reader()) for _ in range(4)]
    await asyncio.gather(*(writer(w) for w in range(8)))
    stop.set()
    await asyncio.gather(*readers)
    assert seen_bad == []
    assert len(await s.get_items()) == 8 * 10 * 3


WRITER = textwrap.dedent(
    """
    import asyncio, sys
    from agents_memory import SessionStore

    async def main(url, s_table, m_table, w, batches, size):
        async with SessionStore.from_url(url, sessions_table=s_table, messages_table=m_table) as st:
            s = st.session("shared")
            for b in range(batches):
                await s.add_items([{"w": w, "b": b, "k": k} for k in range(size)])

    url, s_table, m_table, w = sys.argv[1:5]
    asyncio.run(main(url, s_table, m_table, int(w), 30, 5))
    """
)


async def test_several_processes_on_one_database(file_backend: Any, store: SessionStore) -> None:
    """Four processes appending to one session (one SQLite file, or Postgres) lose nothing."""
    await store.session("warmup").add_items([{"x": 0}])  # creates the schema
    names = store.table_names
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            WRITER,
            file_backend.url,
            names.sessions,
            names.messages,
            str(w),
            stderr=subprocess.PIPE,
        )
        for w in range(4)
    ]
    for p in procs:
        _, err = await p.communicate()
        assert p.returncode == 0, err.decode()
    items = await store.session("shared").get_items()
    assert_batches_contiguous(items, 4, 30, 5)
    rows, top = await stored(store, "shared")
    assert [p for p, _ in rows] == list(range(1, 4 * 30 * 5 + 1))
    assert top == 4 * 30 * 5
