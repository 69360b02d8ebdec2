"""Concurrency: many writers, poppers and readers on one session, many sessions, engines, processes.

Every batch is tagged (writer, batch, k, n) so a read can tell a whole batch from a
torn or interleaved one; "lost" counts missing, duplicated, torn or reordered
batches and items.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import textwrap
from typing import Any

import pytest
from _support import Ledger, Transactions, batch_check, make_batch, open_store, scaled

from agents_memory import SessionStore

pytestmark = pytest.mark.reliability

TASKS = 64


def order_errors(whole: dict[Any, int], items: list[dict[str, Any]]) -> int:
    """Batches of one writer that appear out of the order it wrote them."""
    seen: dict[int, int] = {}
    errors = 0
    for item in items:
        if item["k"] == 0:
            w, b = item["w"], item["b"]
            if (w, b) in whole and b <= seen.get(w, -1):
                errors += 1
            seen[w] = max(b, seen.get(w, -1))
    return errors


async def test_64_writers_on_one_session(store: SessionStore, ledger: Ledger) -> None:
    """64 tasks x 50 appends to one session: every batch present once, whole, in writer order."""
    appends = scaled(50)

    async def writer(w: int) -> None:
        s = store.session("shared")
        for b in range(appends):
            await s.add_items(make_batch(w, b, 1 + (w + b) % 4))

    await store.session("shared").get_items()  # schema checked: every write takes the hot path
    commits = Transactions(store)
    await asyncio.gather(*(writer(w) for w in range(TASKS)))
    items = await store.session("shared").get_items()
    whole, torn = batch_check(items)
    missing = TASKS * appends - len(whole)
    lost = missing + torn + order_errors(whole, items)
    ledger.add(
        "Concurrency",
        f"{TASKS} tasks x {appends} add_items (1-4 items) on one session",
        times=TASKS * appends,
        lost=lost,
        unit="batches",
        note=commits.note(TASKS * appends),
    )
    assert lost == 0
    assert len(whole) == TASKS * appends
    if commits.counted:  # SQLite file: the batches really went through grouped commits
        assert 0 < commits.since() < TASKS * appends


async def test_64_writers_on_64_sessions(store: SessionStore, ledger: Ledger) -> None:
    """64 tasks x 50 appends, one session each: each session holds exactly its own batches."""
    appends = scaled(50)

    async def writer(w: int) -> int:
        s = store.session(f"s{w}")
        for b in range(appends):
            await s.add_items(make_batch(w, b, 2))
        items = await s.get_items()
        expected = [i for b in range(appends) for i in make_batch(w, b, 2)]
        return sum(1 for a, e in zip(items, expected, strict=False) if a != e) + abs(
            len(items) - len(expected)
        )

    commits = Transactions(store)
    lost = sum(await asyncio.gather(*(writer(w) for w in range(TASKS))))
    ledger.add(
        "Concurrency",
        f"{TASKS} tasks x {appends} add_items on {TASKS} sessions",
        times=TASKS * appends,
        lost=lost,
        unit="batches",
        note=commits.note(TASKS * appends),
    )
    assert lost == 0


async def test_16_poppers_drain_2000_items(store: SessionStore, ledger: Ledger) -> None:
    """16 concurrent poppers drain 2,000 items: each item returned exactly once, newest first."""
    total = scaled(2000, minimum=100)
    s = store.session("queue")
    for start in range(0, total, 250):
        await s.add_items([{"n": n} for n in range(start, min(start + 250, total))])
    popped: list[int] = []
    out_of_order = false_empty = in_flight = 0
    commits = Transactions(store)

    async def popper() -> None:
        nonlocal out_of_order, false_empty, in_flight
        last = total
        while True:
            in_flight += 1
            item = await store.session("queue").pop_item()
            in_flight -= 1
            if item is None:
                # "empty" is only true if every remaining item is being claimed by another popper
                false_empty += total - len(popped) > in_flight
                return
            popped.append(item["n"])
            out_of_order += item["n"] >= last  # one popper sees the stack shrink
            last = item["n"]

    await asyncio.gather(*(popper() for _ in range(16)))
    missing = total - len(set(popped))
    duplicates = len(popped) - len(set(popped))
    left = len(await s.get_items())
    lost = missing + duplicates + left + out_of_order + false_empty
    ledger.add(
        "Concurrency",
        f"16 concurrent poppers draining {total} items from one session",
        times=total,
        lost=lost,
        unit="items",
        note=(
            f"{duplicates} returned twice, {missing} never returned, {false_empty} poppers "
            "told 'empty' while unclaimed items remained"
            + (f"; {total + 16} pops in {commits.since()} SQLite transactions" * commits.counted)
        ),
    )
    assert sorted(popped) == list(range(total))
    assert lost == 0


class ReadChecker:
    """Checks every read of a session being appended to: whole batches, nothing disappears."""

    def __init__(self) -> None:
        self.reads = 0
        self.bad = 0
        self.last: list[dict[str, Any]] = []

    def full(self, items: list[dict[str, Any]]) -> None:
        """A whole-session read: whole batches, and everything the last read saw still there."""
        self.reads += 1
        _, torn = batch_check(items)
        if torn or items[: len(self.last)] != self.last:
            self.bad += 1
        self.last = items

    def tail(self, items: list[dict[str, Any]], limit: int) -> None:
        """A limit read: at most ``limit`` items, whole batches after a possibly cut first one."""
        self.reads += 1
        start = next((i for i, item in enumerate(items) if item["k"] == 0), len(items))
        head = items[:start]
        _, torn = batch_check(items[start:])
        ks = [item["k"] for item in head]
        ok_head = not head or ks == list(range(head[0]["n"] - len(head), head[0]["n"]))
        if torn or not ok_head or len(items) > limit:
            self.bad += 1


async def run_mixed(
    stores: list[SessionStore], writers: int, appends: int, readers: int, read_pause: float = 0
) -> tuple[int, int, int]:
    """Writers and readers on one session id over the given stores; returns (reads, bad, lost).

    Readers re-read as fast as they can, pausing ``read_pause`` seconds between reads.
    """
    stop = asyncio.Event()
    checkers: list[ReadChecker] = []

    async def writer(w: int, st: SessionStore) -> None:
        s = st.session("mixed")
        for b in range(appends):
            await s.add_items(make_batch(w, b, 1 + (w * 7 + b) % 5))

    async def reader(r: int, st: SessionStore) -> None:
        checker = ReadChecker()
        checkers.append(checker)
        s = st.session("mixed")
        while not stop.is_set():
            if r % 3 == 0:
                checker.full(await s.get_items())
            elif r % 3 == 1:
                limit = random.randint(1, 12)
                checker.tail(await s.get_items(limit=limit), limit)
            else:
                checker.full([i async for i in s.iter_items(batch_size=7)])
            await asyncio.sleep(read_pause)

    reading = [
        asyncio.create_task(reader(r, stores[r % len(stores)]))
        for r in range(readers * len(stores))
    ]
    try:
        await asyncio.gather(
            *(writer(w, stores[w % len(stores)]) for w in range(writers * len(stores)))
        )
    finally:
        stop.set()
        await asyncio.gather(*reading, return_exceptions=True)
    items = await stores[0].session("mixed").get_items()
    whole, torn = batch_check(items)
    lost = writers * len(stores) * appends - len(whole) + torn + order_errors(whole, items)
    return sum(c.reads for c in checkers), sum(c.bad for c in checkers), lost


async def test_mixed_readers_and_writers_one_engine(store: SessionStore, ledger: Ledger) -> None:
    """16 writers and 6 readers (full, limit, streamed) on one session: no read sees a tear."""
    appends = scaled(25)
    reads, bad, lost = await run_mixed([store], writers=16, appends=appends, readers=6)
    ledger.add(
        "Concurrency",
        f"mixed: 16 writers x {appends} add_items + 6 readers, one engine",
        times=16 * appends,
        lost=lost + bad,
        unit="batches",
        note=f"{reads} concurrent reads checked, {bad} saw a torn batch or lost items",
    )
    assert (lost, bad) == (0, 0)


async def test_mixed_readers_and_writers_four_engines(
    file_backend: Any, store: SessionStore, ledger: Ledger
) -> None:
    """Four engines (own pools, own SQLite write queues) on one database: nothing torn or lost."""
    appends = scaled(15)
    await store.session("warmup").add_items([{"x": 0}])  # creates the schema
    names = store.table_names
    others = [open_store(file_backend.url, names) for _ in range(3)]
    try:
        reads, bad, lost = await run_mixed([store, *others], writers=4, appends=appends, readers=2)
    finally:
        for other in others:
            await other.close()
    ledger.add(
        "Concurrency",
        f"mixed: 4 engines x (4 writers x {appends} add_items + 2 readers), one process",
        times=16 * appends,
        lost=lost + bad,
        unit="batches",
        note=f"{reads} concurrent reads checked",
    )
    assert (lost, bad) == (0, 0)


CHILD = textwrap.dedent(
    """
    import asyncio, json, random, sys
    sys.path.insert(0, sys.argv[5])
    from _support import open_store
    from test_load import run_mixed
    from agents_memory import TableNames

    async def main(url, names, appends, offset):
        store = open_store(url, names)
        try:
            # shift writer ids so the processes' batches are distinguishable
            import test_load
            original = test_load.make_batch
            test_load.make_batch = lambda w, b, n, pad="": original(w + offset, b, n, pad)
            reads, bad, _ = await run_mixed(
                [store], writers=4, appends=appends, readers=2, read_pause=0.002
            )
        finally:
            await store.close()
        print(json.dumps({"reads": reads, "bad": bad}), flush=True)

    url, s_table, m_table, appends, _, offset = sys.argv[1:7]
    asyncio.run(main(url, TableNames(s_table, m_table), int(appends), int(offset)))
    """
)


async def test_mixed_readers_and_writers_four_processes(
    file_backend: Any, store: SessionStore, ledger: Ledger
) -> None:
    """Four processes, each with writers and readers, on one SQLite file or Postgres database.

    Readers pause 2 ms between reads. With every process's event loop saturated by
    readers that never pause, SQLite's polling lock can starve one process's writer
    past the busy timeout (a DatabaseBusyError, nothing lost): see RELIABILITY.md.
    """
    appends = scaled(15)
    await store.session("warmup").add_items([{"x": 0}])
    names = store.table_names
    here = str(__import__("pathlib").Path(__file__).parent)
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            CHILD,
            file_backend.url,
            names.sessions,
            names.messages,
            str(appends),
            here,
            str(100 * p),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for p in range(4)
    ]
    outputs = [await proc.communicate() for proc in procs]  # reap all before judging any
    reads = bad = 0
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode()[-3000:]
        summary = json.loads(out.decode().strip().splitlines()[-1])
        reads += summary["reads"]
        bad += summary["bad"]
    items = await store.session("mixed").get_items()
    whole, torn = batch_check(items)
    lost = 4 * 4 * appends - len(whole) + torn + order_errors(whole, items)
    ledger.add(
        "Concurrency",
        f"mixed: 4 processes x (4 writers x {appends} add_items + 2 readers), one database",
        times=16 * appends,
        lost=lost + bad,
        unit="batches",
        note=f"{reads} concurrent reads (2 ms apart per reader) checked across processes",
    )
    assert (lost, bad) == (0, 0)
