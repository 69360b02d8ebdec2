"""``python -m benchmarks.group_commit``: what SQLite group commit costs and what it holds.

The main harness (``python -m benchmarks --targets sqlite --ungrouped``) gives the
throughput of ours with and without group commit against raw aiosqlite. This adds
what a throughput table cannot show:

* **hold**: how long one group holds the file's write lock (``BEGIN IMMEDIATE`` to the
  end of ``COMMIT``) when it is full (``GROUP_MAX_BATCHES`` turns of 4 items, run
  together as the writer runs a group's appends: ``fold_appends``), against one turn alone;
* **latency under load**: one session appending a turn at a time while N other sessions
  append as fast as they can: p50/p99/max of its ``add_items`` for raw aiosqlite, ours
  (grouped), ours without the hold limit (``ours_nolimit``) and ours with group commit
  off (``ours_1tx``), with the load's batches/s;
* **another writer's turn**: during that load, a separate connection (as another
  process would) writes a row every 20 ms; how long its ``BEGIN IMMEDIATE`` waits;
* **the holds the writer really had** during that load, with and without the hold
  limit (``GROUP_MAX_HOLD``);
* **where a burst round goes** (``--anatomy``): the main harness's burst round (64 sessions
  at once, each reads its latest 20 then appends a turn), its read half alone and its
  append half alone, for the same four, interleaved round by round; and a
  *floor*: the same SQL and JSON work of one round done synchronously on one thread, with
  no event loop and no thread hops, all 64 appends in one transaction. No implementation
  doing that work can beat the floor, so raw's burst round divided by the floor is the
  most any implementation could be above raw on this machine.

Every implementation uses the same durability: WAL with SQLite's default
``synchronous`` (FULL), as the main harness does. Each table is printed with the
machine's load average (``os.getloadavg``) before and after it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sqlite3
import statistics
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from agents_memory import SessionStore, TableNames, create_engine
from agents_memory._codec import decode_rows, encode_items
from agents_memory._databases import sqlite as lite
from agents_memory._databases.base import GROUP_COMMIT_OPTION
from benchmarks.items import ItemSource
from benchmarks.raw import RawSqlite, encode
from benchmarks.run import pin_cpus
from benchmarks.stats import load_average, percentile

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


def _ms(values: list[float]) -> str:
    return (
        f"p50 {percentile(values, 0.5) * 1e3:.2f} ms, p99 {percentile(values, 0.99) * 1e3:.2f} ms, "
        f"max {max(values) * 1e3:.2f} ms"
    )


def measure_hold(path: Path, items: ItemSource, repeats: int) -> dict[str, list[float]]:
    """Seconds from ``BEGIN IMMEDIATE`` to the end of ``COMMIT``: one turn, and a full group."""
    conn = lite.open_connection((str(path),), {})
    expiry = lite.has_expiry(conn, NAMES)  # at head: positions, the statements ours runs
    ex = lite.LiteExecutor(conn, lite.compiled(NAMES, expiry))
    turns = [encode_items(items.turn()) for _ in range(lite.GROUP_MAX_BATCHES)]
    out: dict[str, list[float]] = {"one turn": [], "full group": []}
    try:
        for r in range(repeats):
            started = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            lite.add_body(ex, f"one-{r}", turns[0], expiry=expiry)
            conn.commit()
            out["one turn"].append(time.perf_counter() - started)
            appends = [
                lite.Append(NAMES, f"group-{r}-{k}", data, None) for k, data in enumerate(turns)
            ]
            started = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("SAVEPOINT agents_memory_batch")  # as the writer runs a group's appends
            lite.fold_appends(conn, appends)
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


Session = Callable[[str], Any]
"""Make a session object (raw's handle or ours) by id."""


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


IMPLS = ("raw", "ours", "ours_nolimit", "ours_1tx")
"""``ours_nolimit``: ours without the hold limit (``GROUP_MAX_HOLD`` infinite), as before it;
``ours_1tx``: ours with group commit off."""


async def main_async(args: argparse.Namespace) -> None:
    """Hold times, latency under load, and (``--anatomy``) where a burst round goes."""
    items = ItemSource()
    with tempfile.TemporaryDirectory() as tmp:
        if not args.anatomy_only:
            await _holds_and_latency(Path(tmp), items, args)
        if args.anatomy or args.anatomy_only:
            await _anatomy(Path(tmp), items, args)


async def _holds_and_latency(tmp: Path, items: ItemSource, args: argparse.Namespace) -> None:
    hold_path = tmp / "hold.db"
    await _schema(hold_path)
    print(f"\n## Write-lock hold per transaction ({args.repeats} repeats; {load_average()})\n")
    hold = measure_hold(hold_path, items, args.repeats)
    print(f"| transaction | hold ({lite.GROUP_MAX_BATCHES} turns of 4 items in a group) |")
    print("|---|---|")
    for what, values in hold.items():
        print(f"| {what} | {_ms(values)} |")
    print(
        f"\n## One session appending while {args.writers} others append "
        f"({args.calls} calls; {load_average()})\n"
    )
    print("| implementation | probe add_items | load batches/s | other connection's lock wait |")
    print("|---|---|---:|---|")
    holds: dict[str, tuple[int, list[float]]] = {}
    for key in IMPLS:
        path = tmp / f"{key}.db"
        await _schema(path)
        async with _impl(key, path) as (session, writer):

            async def add(
                sid: str, batch: list[dict[str, Any]], session: Session = session
            ) -> None:
                await session(sid).add_items(batch)

            before = writer.groups if writer is not None else 0
            latencies, rate, waits = await under_load(add, path, items, args.writers, args.calls)
            if writer is not None:  # (the queue keeps the latest HOLDS_KEPT)
                ran = writer.groups - before
                holds[key] = (ran, writer.holds()[-min(ran, lite.HOLDS_KEPT) :])
        waited = _ms(waits) if waits else "-"
        print(f"| {key} | {_ms(latencies)} | {rate:,.0f} | {waited} ({len(waits)} writes) |")
    print(
        f"\nWrite-lock holds of ours' writer during that load (limit GROUP_MAX_HOLD = "
        f"{lite.GROUP_MAX_HOLD * 1e3:g} ms once a group has begun, plus the batch running "
        f"then and the COMMIT; {load_average()}):\n"
    )
    print(f"| implementation | transactions | hold (the latest {lite.HOLDS_KEPT:,} at most) |")
    print("|---|---:|---|")
    for key, (ran, values) in holds.items():
        print(f"| {key} | {ran:,} | {_ms(values) if values else '-'} |")


@contextlib.asynccontextmanager
async def _impl(key: str, path: Path) -> AsyncIterator[tuple[Session, lite.GroupWriter | None]]:
    """Sessions of raw aiosqlite, ours, ours without a hold limit or with group commit off.

    With ours' writer thread (``None`` for raw).
    """
    if key == "raw":
        raw = RawSqlite(str(path), NAMES)
        await raw.open()
        try:
            yield raw.session, None
        finally:
            await raw.close()
        return
    options = {"execution_options": {GROUP_COMMIT_OPTION: False}} if key == "ours_1tx" else {}
    engine = create_engine(f"sqlite:///{path}", **options)
    store = SessionStore(engine, sessions_table=NAMES.sessions, messages_table=NAMES.messages)
    limit = lite.GROUP_MAX_HOLD
    try:
        if key == "ours_nolimit":  # read when the engine's writer is made, by the first write
            lite.GROUP_MAX_HOLD = math.inf
        await store.session("warm").add_items([{"role": "user", "content": "warm"}])
        lite.GROUP_MAX_HOLD = limit
        yield store.session, lite._threads_for(engine).writer  # noqa: SLF001 - our own
    finally:
        lite.GROUP_MAX_HOLD = limit
        await store.close()
        await engine.dispose()


BURST = 64
"""Sessions at once in a burst round, as in the main harness's ``burst``."""


async def _read_half(sessions: list[Any], _turns: list[list[dict[str, Any]]]) -> None:
    await asyncio.gather(*(s.get_items(limit=20) for s in sessions))


async def _append_half(sessions: list[Any], turns: list[list[dict[str, Any]]]) -> None:
    await asyncio.gather(*(s.add_items(t) for s, t in zip(sessions, turns, strict=True)))


async def _burst(sessions: list[Any], turns: list[list[dict[str, Any]]]) -> None:
    async def turn(s: Any, t: list[dict[str, Any]]) -> None:
        await s.get_items(limit=20)
        await s.add_items(t)

    await asyncio.gather(*(turn(s, t) for s, t in zip(sessions, turns, strict=True)))


PARTS: dict[str, Callable[[list[Any], list[list[dict[str, Any]]]], Awaitable[None]]] = {
    "burst round": _burst,
    "read half (64 latest-20 reads at once)": _read_half,
    "append half (64 appends of a turn at once)": _append_half,
}


def _connections(path: Path, *, plain: bool) -> tuple[sqlite3.Connection, sqlite3.Connection]:
    """A writer and a reader: raw's (the driver's defaults, the same pragmas), or ours."""
    if not plain:
        return lite.open_connection((str(path),), {}), lite.open_connection((str(path),), {})
    pair = (
        sqlite3.connect(path, isolation_level=None),
        sqlite3.connect(path, isolation_level=None),
    )
    for conn in pair:
        for pragma in ("busy_timeout = 30000", "foreign_keys = ON", "journal_mode = WAL"):
            conn.execute(f"PRAGMA {pragma}")
    return pair


class _Floor:
    """One burst round's SQL and JSON work, synchronously on one thread, one transaction."""

    def __init__(self, path: Path, *, plain: bool) -> None:
        self.plain = plain
        self.writer, self.reader = _connections(path, plain=plain)
        self.expiry = lite.has_expiry(self.writer, NAMES)
        sql = lite.compiled(NAMES, self.expiry)
        self.ex, self.rex = lite.LiteExecutor(self.writer, sql), lite.LiteExecutor(self.reader, sql)
        self.raw = RawSqlite(str(path), NAMES)  # only its SQL text
        self.sids = [f"floor-{plain}-{k}" for k in range(BURST)]

    def fill(self, items: ItemSource) -> None:
        """20 items per session (untimed), as the implementations' sessions have."""
        write = encode if self.plain else encode_items  # each its own codec, as it reads
        self.writer.execute("BEGIN IMMEDIATE")
        for sid in self.sids:
            lite.add_body(self.ex, sid, write(items.items(20)), expiry=self.expiry)
        self.writer.commit()

    def round(self, turns: list[list[dict[str, Any]]]) -> None:
        """Each session's latest 20 decoded, then every turn appended in one transaction."""
        w, raw = self.writer, self.raw
        if self.plain:  # raw's statements, bare json, no savepoints
            for sid in self.sids:
                rows = self.reader.execute(raw.latest, (sid, 20)).fetchall()
                [json.loads(r[1]) for r in reversed(rows)]
            data = [encode(t) for t in turns]
            w.execute("BEGIN IMMEDIATE")
            for sid, d in zip(self.sids, data, strict=True):
                ((top,),) = w.execute(raw.upsert, (sid, len(d))).fetchall()
                first = top - len(d) + 1
                w.executemany(raw.insert, [(sid, first + i, x) for i, x in enumerate(d)])
            w.commit()
            return
        for sid in self.sids:  # ours: its statements and codec, the appends run together
            decode_rows(
                reversed(self.rex.rows("select_latest", {"sid": sid, "n": 20})), on_corrupt="skip"
            )
        data = [encode_items(t) for t in turns]
        appends = [lite.Append(NAMES, sid, d, None) for sid, d in zip(self.sids, data, strict=True)]
        w.execute("BEGIN IMMEDIATE")
        w.execute("SAVEPOINT agents_memory_batch")  # the writer's group: its appends folded
        lite.fold_appends(w, appends)
        w.execute("RELEASE agents_memory_batch")
        w.commit()

    def close(self) -> None:
        self.writer.close()
        self.reader.close()


def _floors(path: Path, items: ItemSource, rounds: int, repeats: int) -> dict[bool, float]:
    """Median ms per round of the floor, ours (False) and raw's (True) work, taking turns."""
    floors = {plain: _Floor(path, plain=plain) for plain in (False, True)}
    took: dict[bool, list[float]] = {False: [], True: []}
    try:
        for floor in floors.values():
            floor.fill(items)
        for _ in range(repeats):
            for plain, floor in floors.items():
                one = []
                for _ in range(rounds):
                    turns = [items.turn() for _ in floor.sids]
                    started = time.perf_counter()
                    floor.round(turns)
                    one.append(time.perf_counter() - started)
                took[plain].append(statistics.median(one))
    finally:
        for floor in floors.values():
            floor.close()
    return {plain: statistics.median(v) * 1e3 for plain, v in took.items()}


async def _parts(tmp: Path, items: ItemSource, rounds: int, repeats: int) -> dict[Any, float]:
    """Median ms per round of each part for each implementation, taking turns part by part.

    The order of the turns rotates each repeat: what one implementation leaves
    behind (a WAL to checkpoint, pages to flush) does not always fall on the same next one.
    """
    per: dict[tuple[str, str], list[float]] = {}
    async with contextlib.AsyncExitStack() as stack:
        impls: dict[str, list[Any]] = {}
        for key in IMPLS:
            path = tmp / f"anatomy-{key}.db"
            await _schema(path)
            session, _ = await stack.enter_async_context(_impl(key, path))
            sessions = [session(f"b{k}") for k in range(BURST)]
            for s in sessions:  # 20 items each: every read returns 20
                await s.add_items(items.items(20))
            impls[key] = sessions
        keys = list(impls)
        for r in range(repeats):
            order = keys[r % len(keys) :] + keys[: r % len(keys)]  # nobody always follows raw
            for part, run in PARTS.items():
                for key in order:  # interleaved: load hits all alike
                    sessions = impls[key]
                    took = []
                    for _ in range(rounds):
                        turns = [items.turn() for _ in sessions]
                        started = time.perf_counter()
                        await run(sessions, turns)
                        took.append(time.perf_counter() - started)
                    per.setdefault((part, key), []).append(statistics.median(took))
    return {k: statistics.median(v) * 1e3 for k, v in per.items()}


async def _anatomy(tmp: Path, items: ItemSource, args: argparse.Namespace) -> None:
    """Each part's ms per round for each implementation, interleaved; then the floors."""
    rounds, repeats = args.anatomy_rounds, args.anatomy_repeats
    load_before = load_average()
    ms = await _parts(tmp, items, rounds, repeats)
    floor_path = tmp / "floor.db"
    await _schema(floor_path)
    floors = _floors(floor_path, items, rounds, repeats)
    print(
        f"\n## Where a burst round goes: ms per round, median of {repeats} repeats of "
        f"{rounds} rounds ({load_before} before, {load_average()} after)\n"
    )
    print("| part | " + " | ".join(IMPLS) + " | raw ÷ ours |")
    print("|---|" + "---:|" * (len(IMPLS) + 1))
    for part in PARTS:
        cells = " | ".join(f"{ms[part, key]:.2f}" for key in IMPLS)
        print(f"| {part} | {cells} | {ms[part, 'raw'] / ms[part, 'ours']:.2f} |")
    raw_burst = ms["burst round", "raw"]
    for plain, label in ((False, "ours' SQL and codec"), (True, "raw's SQL and bare json")):
        floor = floors[plain]
        print(
            f"| floor: one round synchronously, one transaction, {label} | {floor:.2f} | | | "
            f"| raw's burst ÷ floor: {raw_burst / floor:.2f} |"
        )


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, pin the CPU as the main harness does, run."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.group_commit", description=__doc__)
    p.add_argument("--writers", type=int, default=63, help="sessions appending as load (63)")
    p.add_argument("--calls", type=int, default=300, help="probe appends measured (300)")
    p.add_argument("--repeats", type=int, default=50, help="hold-time repeats (50)")
    p.add_argument("--cpu", type=int, default=1, help="pin to that many CPUs (1; -1: not)")
    p.add_argument(
        "--hold-ms",
        type=float,
        default=None,
        help=f"ours' hold limit in ms (default GROUP_MAX_HOLD, {lite.GROUP_MAX_HOLD * 1e3:g})",
    )
    p.add_argument("--anatomy", action="store_true", help="also: where a burst round goes")
    p.add_argument("--anatomy-only", action="store_true", help="only the burst anatomy")
    p.add_argument("--anatomy-rounds", type=int, default=20, help="rounds per repeat (20)")
    p.add_argument("--anatomy-repeats", type=int, default=5, help="repeats (5)")
    args = p.parse_args(argv)
    if args.hold_ms is not None:  # (read when a writer is made)
        lite.GROUP_MAX_HOLD = args.hold_ms / 1e3
    print(f"{pin_cpus(args.cpu)}; SQLite {sqlite3.sqlite_version}; WAL, synchronous FULL")
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
