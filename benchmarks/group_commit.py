"""``python -m benchmarks.group_commit``: what SQLite group commit costs and what it holds.

The main harness (``python -m benchmarks --targets sqlite --ungrouped``) gives the
throughput of ours with and without group commit against raw aiosqlite. This adds
what a throughput table cannot show:

* **hold**: how long one group holds the file's write lock (``BEGIN IMMEDIATE`` to the
  end of ``COMMIT``) when it is full (``GROUP_MAX_BATCHES`` turns of 4 items, each in
  its savepoint), against one turn alone: the bound other writers of the file wait at most;
* **latency under load**: one session appending a turn at a time while N other sessions
  append as fast as they can: p50/p99/max of its ``add_items`` for raw aiosqlite, ours
  (grouped) and ours with group commit off, with the load's batches/s;
* **another writer's turn**: during that load, a separate connection (as another
  process would) writes a row every 20 ms; how long its ``BEGIN IMMEDIATE`` waits.

Every implementation uses the same durability: WAL with SQLite's default
``synchronous`` (FULL), as the main harness does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sqlite3
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agents_memory import SessionStore, TableNames, create_engine
from agents_memory._codec import encode_items
from agents_memory._databases import sqlite as lite
from benchmarks.items import ItemSource
from benchmarks.raw import RawSqlite
from benchmarks.run import pin_cpus

NAMES = TableNames("gc_sessions", "gc_messages")


async def _schema(path: Path) -> None:
    """Our schema at head (created and stamped), for every implementation alike."""
    engine = create_engine(f"sqlite:///{path}")
    store = SessionStore(
        engine, sessions_table=NAMES.sessions, messages_table=NAMES.messages, create_tables=True
    )
    try:
        await store.session("schema").get_items()
    finally:
        await store.close()
        await engine.dispose()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _ms(values: list[float]) -> str:
    return (
        f"p50 {_pct(values, 0.5) * 1e3:.2f} ms, p99 {_pct(values, 0.99) * 1e3:.2f} ms, "
        f"max {max(values) * 1e3:.2f} ms"
    )


def measure_hold(path: Path, items: ItemSource, repeats: int) -> dict[str, list[float]]:
    """Seconds from ``BEGIN IMMEDIATE`` to the end of ``COMMIT``: one turn, and a full group."""
    conn = lite.open_connection((str(path),), {})
    ex = lite.LiteExecutor(conn, lite.compiled(NAMES))
    turns = [encode_items(items.turn()) for _ in range(lite.GROUP_MAX_BATCHES)]
    out: dict[str, list[float]] = {"one turn": [], "full group": []}
    try:
        for r in range(repeats):
            started = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            lite.add_body(ex, f"one-{r}", turns[0])
            conn.commit()
            out["one turn"].append(time.perf_counter() - started)
            started = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            for k, data in enumerate(turns):
                conn.execute("SAVEPOINT agents_memory_batch")
                lite.add_body(ex, f"group-{r}-{k}", data)
                conn.execute("RELEASE agents_memory_batch")
            conn.commit()
            out["full group"].append(time.perf_counter() - started)
    finally:
        conn.close()
    return out


class _OtherWriter:
    """A separate connection writing a row every 20 ms on its own thread: its lock waits."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.waits: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        conn = lite.open_connection((str(self.path),), {})
        try:
            conn.execute("CREATE TABLE IF NOT EXISTS other_writer (x INTEGER)")
            while not self.stop.wait(0.02):
                started = time.perf_counter()
                conn.execute("BEGIN IMMEDIATE")
                self.waits.append(time.perf_counter() - started)
                conn.execute("INSERT INTO other_writer VALUES (1)")
                conn.commit()
        finally:
            conn.close()


async def under_load(
    add: Callable[[str, list[dict[str, Any]]], Awaitable[None]],
    path: Path,
    items: ItemSource,
    writers: int,
    calls: int,
) -> tuple[list[float], float, list[float]]:
    """The probe's latencies, the load's batches/s, and the other connection's lock waits."""
    stop = asyncio.Event()
    done = 0

    async def loader(w: int) -> None:
        nonlocal done
        while not stop.is_set():
            await add(f"load-{w}", items.turn())
            done += 1

    load = [asyncio.create_task(loader(w)) for w in range(writers)]
    other = _OtherWriter(path)
    await asyncio.sleep(0.2)  # the load is running
    other.thread.start()
    latencies: list[float] = []
    started, done_before = time.perf_counter(), done
    for _ in range(calls):
        t = time.perf_counter()
        await add("probe", items.turn())
        latencies.append(time.perf_counter() - t)
    rate = (done - done_before) / (time.perf_counter() - started)
    other.stop.set()
    await asyncio.to_thread(other.thread.join)
    stop.set()
    await asyncio.gather(*load)
    return latencies, rate, other.waits


async def main_async(args: argparse.Namespace) -> None:
    """Hold times, then latency under load for raw, ours and ours with group commit off."""
    items = ItemSource()
    with tempfile.TemporaryDirectory() as tmp:
        hold_path = Path(tmp) / "hold.db"
        await _schema(hold_path)
        hold = measure_hold(hold_path, items, args.repeats)
        print(f"\n## Write-lock hold per transaction ({args.repeats} repeats)\n")
        print(f"| transaction | hold ({lite.GROUP_MAX_BATCHES} turns of 4 items in a group) |")
        print("|---|---|")
        for what, values in hold.items():
            print(f"| {what} | {_ms(values)} |")
        print(
            f"\n## One session appending while {args.writers} others append ({args.calls} calls)\n"
        )
        print(
            "| implementation | probe add_items | load batches/s | other connection's lock wait |"
        )
        print("|---|---|---:|---|")
        for key in ("raw", "ours", "ours_1tx"):
            path = Path(tmp) / f"{key}.db"
            await _schema(path)
            async with _impl(key, path) as add:
                latencies, rate, waits = await under_load(
                    add, path, items, args.writers, args.calls
                )
            waited = _ms(waits) if waits else "-"
            print(f"| {key} | {_ms(latencies)} | {rate:,.0f} | {waited} ({len(waits)} writes) |")


@contextlib.asynccontextmanager
async def _impl(key: str, path: Path) -> Any:
    """``add(session_id, items)`` of raw aiosqlite, ours, or ours with group commit off."""
    if key == "raw":
        raw = RawSqlite(str(path), NAMES)
        await raw.open()
        try:

            async def add_raw(sid: str, batch: list[dict[str, Any]]) -> None:
                await raw.session(sid).add_items(batch)

            yield add_raw
        finally:
            await raw.close()
        return
    options = {"execution_options": {lite.GROUP_COMMIT_OPTION: False}} if key == "ours_1tx" else {}
    engine = create_engine(f"sqlite:///{path}", **options)
    store = SessionStore(engine, sessions_table=NAMES.sessions, messages_table=NAMES.messages)
    try:

        async def add_ours(sid: str, batch: list[dict[str, Any]]) -> None:
            await store.session(sid).add_items(batch)  # type: ignore[arg-type]

        yield add_ours
    finally:
        await store.close()
        await engine.dispose()


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, pin the CPU as the main harness does, run."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.group_commit", description=__doc__)
    p.add_argument("--writers", type=int, default=63, help="sessions appending as load (63)")
    p.add_argument("--calls", type=int, default=300, help="probe appends measured (300)")
    p.add_argument("--repeats", type=int, default=50, help="hold-time repeats (50)")
    p.add_argument("--cpu", type=int, default=1, help="pin to that many CPUs (1; -1: not)")
    args = p.parse_args(argv)
    print(f"{pin_cpus(args.cpu)}; SQLite {sqlite3.sqlite_version}; WAL, synchronous FULL")
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
