"""``python -m benchmarks.partitions``: latest-20 on a big Postgres table, plain vs partitioned.

Two table sets on one Postgres, each holding ``--items`` items over ``--sessions``
sessions (default 10,000,000 over 100,000: 100 items each): one migrated plain, one
with the messages table hash-partitioned into ``--partitions`` partitions (default
32). Both are filled on the server (``INSERT … SELECT`` from ``generate_series``,
built with Core from the model tables: the same rows, positions and counters the
store writes), analysed, then read the way an agent does before each turn:

* **latest-20, one caller**: ``get_items(limit=20)`` of a random session, ``--calls``
  times in a row; p50 and p99 per layout;
* **latest-20, 64 at once**: bursts of 64 random sessions (more than the engine's
  pool of 10); p50 and p99 of the calls, per layout;
* **raw asyncpg** runs the same ``SELECT`` on the plain tables as the floor.

Layouts alternate call by call (ABAB…), so drift on a shared machine hits both alike.
Tables are dropped at the end unless ``--keep`` is given (then a later run with the same
``--tag`` reuses them and skips the fill). ``--quick``: 200,000 items over 2,000 sessions.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
from sqlalchemy import MetaData, Table, bindparam, func, insert, literal, select, text, true
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.schema import DropTable

from agents_memory import SessionStore, TableNames, create_engine, get_models, migrations
from benchmarks.run import DEFAULT_PG
from benchmarks.workloads import check

PAYLOAD_BYTES = 240
"""Each item's JSON: a user message of about this size (under TOAST's 2 KB, like most items)."""

BURST = 64


@dataclasses.dataclass
class Layout:
    """One table set under test."""

    label: str
    names: TableNames
    partitions: int | None


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _has_rows(engine: AsyncEngine, names: TableNames) -> int:
    async with engine.connect() as conn:
        messages = get_models(names).Message.__table__
        return int((await conn.execute(select(func.count()).select_from(messages))).scalar_one())


async def fill(engine: AsyncEngine, layout: Layout, items: int, sessions: int) -> float:
    """Fill ``layout``'s tables on the server; seconds taken. Sessions ``s0`` … ``s{n-1}``."""
    models = get_models(layout.names)
    sessions_t: Table = models.Session.__table__
    messages_t: Table = models.Message.__table__
    per = items // sessions
    started = time.perf_counter()
    s = func.generate_series(0, sessions - 1).table_valued("n").render_derived("s")
    sid = literal("s").concat(s.c.n.cast(sessions_t.c.session_id.type))
    body = f'{{"role": "user", "content": "{"x" * (PAYLOAD_BYTES - 36)}"}}'
    async with engine.begin() as conn:
        await conn.execute(
            insert(sessions_t).from_select(
                ["session_id", "last_position"], select(sid, literal(per))
            )
        )
        p = func.generate_series(1, per).table_valued("p").render_derived("p")
        await conn.execute(
            insert(messages_t).from_select(
                ["session_id", "position", "message_data"],
                select(sid, p.c.p, literal(body)).select_from(s).join(p, true()),
            )
        )
    async with engine.connect() as conn:
        autocommit = await conn.execution_options(isolation_level="AUTOCOMMIT")
        quoted = conn.dialect.identifier_preparer.quote
        for table in (layout.names.sessions, layout.names.messages):
            await autocommit.execute(text(f"VACUUM ANALYZE {quoted(table)}"))
    return time.perf_counter() - started


async def drop(engine: AsyncEngine, names: TableNames) -> None:
    async with engine.begin() as conn:
        for table in (*reversed(names.tables), names.version_table, names.migration_lock_table):
            await conn.execute(DropTable(Table(table, MetaData()), if_exists=True))


async def _timed(call: Callable[[], Awaitable[Any]]) -> float:
    start = time.perf_counter()
    await call()
    return (time.perf_counter() - start) * 1000


Reader = Callable[[str], Awaitable[None]]


async def _prepare(engine: AsyncEngine, layouts: list[Layout], args: argparse.Namespace) -> None:
    """Migrate each layout's tables and fill them (unless a kept run already did)."""
    for layout in layouts:
        kw = {"sessions_table": layout.names.sessions, "messages_table": layout.names.messages}
        await migrations.upgrade(engine, partitions=layout.partitions, **kw)
        have = await _has_rows(engine, layout.names)
        if have == 0:
            seconds = await fill(engine, layout, args.items, args.sessions)
            print(f"filled {layout.label}: {args.items:,} items in {seconds:.0f} s", flush=True)
        elif have != args.items:
            sys.exit(f"{layout.names.messages} holds {have:,} items, not {args.items:,}: drop it")


def _raw_reader(pool: asyncpg.Pool, names: TableNames, engine: AsyncEngine) -> Reader:
    """The latest-20 ``SELECT`` on the bare driver: the floor for either layout."""
    messages = get_models(names).Message.__table__
    latest = (
        select(messages.c.position, messages.c.message_data)
        .where(messages.c.session_id == bindparam("sid"))
        .order_by(messages.c.position.desc())
        .limit(20)
    )
    sql = str(latest.compile(dialect=engine.dialect))  # $1 the session, $2 the limit

    async def read(sid: str) -> None:
        async with pool.acquire() as conn:
            check(len(await conn.fetch(sql, sid, 20)) == 20, f"raw latest-20 of {sid}")

    return read


def _ours_reader(store: SessionStore) -> Reader:
    async def read(sid: str) -> None:
        check(len(await store.session(sid).get_items(limit=20)) == 20, f"latest-20 of {sid}")

    return read


async def _one_caller(readers: dict[str, Reader], sids: list[str]) -> dict[str, list[float]]:
    """Each session read by every reader in turn (ABAB…): drift hits every layout alike."""
    times: dict[str, list[float]] = {key: [] for key in readers}
    for sid in sids:
        for key, read in readers.items():
            times[key].append(await _timed(lambda r=read, s=sid: r(s)))  # type: ignore[misc]
    return times


async def _bursts(readers: dict[str, Reader], sids: list[str]) -> dict[str, list[float]]:
    """Bursts of ``BURST`` sessions at once (more than the pool of 10), reader after reader."""
    times: dict[str, list[float]] = {key: [] for key in readers}
    for b in range(max(1, len(sids) // BURST // 4)):
        batch = sids[b * BURST : (b + 1) * BURST]
        for key, read in readers.items():
            calls = [_timed(lambda r=read, s=sid: r(s)) for sid in batch]  # type: ignore[misc]
            times[key].extend(await asyncio.gather(*calls))
    return times


def _report(
    args: argparse.Namespace, one: dict[str, list[float]], burst: dict[str, list[float]]
) -> None:
    load = os.getloadavg()
    print(
        f"\nlatest-20, {args.items:,} items over {args.sessions:,} sessions; load "
        f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}\n"
    )
    print("| reader | one caller p50 ms | p99 ms | 64 at once p50 ms | p99 ms |")
    print("|---|---:|---:|---:|---:|")
    for key, times in one.items():
        print(
            f"| {key} | {statistics.median(times):.3f} | {_percentile(times, 0.99):.3f} | "
            f"{statistics.median(burst[key]):.3f} | {_percentile(burst[key], 0.99):.3f} |"
        )
    plain, part = "ours, plain", f"ours, {args.partitions} partitions"
    print(
        "\npartitioned / plain, p50 time: one caller "
        f"{statistics.median(one[part]) / statistics.median(one[plain]):.2f}, "
        f"64 at once {statistics.median(burst[part]) / statistics.median(burst[plain]):.2f}"
        " (below 1: partitioned is faster)"
    )


async def measure(args: argparse.Namespace) -> None:
    """Prepare both layouts, read them side by side, print the table; drop unless kept."""
    layouts = [
        Layout(
            "plain", TableNames(f"pbench_{args.tag}_sessions", f"pbench_{args.tag}_messages"), None
        ),
        Layout(
            f"{args.partitions} partitions",
            TableNames(f"pbench_{args.tag}_p_sessions", f"pbench_{args.tag}_p_messages"),
            args.partitions,
        ),
    ]
    engine = create_engine(args.url, pool_size=10, max_overflow=0)
    stores = [
        SessionStore(engine, sessions_table=lay.names.sessions, messages_table=lay.names.messages)
        for lay in layouts
    ]
    pool = await asyncpg.create_pool(
        make_url(args.url).set(drivername="postgresql").render_as_string(hide_password=False),
        min_size=10,
        max_size=10,
    )
    try:
        await _prepare(engine, layouts, args)
        readers = {
            f"ours, {lay.label}": _ours_reader(st) for lay, st in zip(layouts, stores, strict=True)
        }
        readers["raw asyncpg, plain"] = _raw_reader(pool, layouts[0].names, engine)
        rng = random.Random(7)
        sids = [f"s{rng.randrange(args.sessions)}" for _ in range(args.calls)]
        await _one_caller(readers, sids[:200])  # warm caches and statement plans
        _report(args, await _one_caller(readers, sids), await _bursts(readers, sids))
    finally:
        await pool.close()
        for store in stores:
            await store.close()
        if not args.keep:
            for layout in layouts:
                await drop(engine, layout.names)
        await engine.dispose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.partitions", description=__doc__)
    parser.add_argument(
        "--url", default=os.environ.get("AGENTS_MEMORY_BENCH_POSTGRES_URL", DEFAULT_PG)
    )
    parser.add_argument("--items", type=int, default=10_000_000)
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=32)
    parser.add_argument("--calls", type=int, default=5_000, help="latest-20 calls per layout")
    parser.add_argument("--quick", action="store_true", help="200,000 items over 2,000 sessions")
    parser.add_argument("--keep", action="store_true", help="keep the tables (reused by --tag)")
    parser.add_argument("--tag", default="main", help="table-name tag (reuse kept tables)")
    args = parser.parse_args(argv)
    if args.quick:
        args.items, args.sessions, args.calls = 200_000, 2_000, 1_000
    if args.items % args.sessions:
        parser.error("--items must be a multiple of --sessions")
    if make_url(args.url).get_backend_name() != "postgresql":
        parser.error("the partitioned layout is Postgres'; --url must be a Postgres URL")
    asyncio.run(measure(args))


if __name__ == "__main__":
    main()
