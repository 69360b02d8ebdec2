"""``python -m benchmarks.prune``: what a retention run costs, and what it costs everyone else.

A store of ``--items`` items over ``--sessions`` sessions (default 1,000,000 over
10,000; ``--quick``: 50,000 over 500) is filled through the bulk path: half the
sessions last written in 2020 (``prune(older_than=30d)`` deletes them whole), the
other half written now and trimmed by ``keep_last`` to a tenth of their items. Then:

* **prune**: items deleted per second, and the peak Python memory of the run
  (``tracemalloc``: it must not grow with the store);
* **appender**: one session appending one item every 5 ms, its ``add_items``
  latency p50/p99 for the same number of appends without a prune (baseline) and
  while the prune runs; the ratio of the p99s is what application traffic pays.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import json
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from sqlalchemy import MetaData, Table
from sqlalchemy.schema import DropTable

from agents_memory import SessionStore, TableNames
from agents_memory._sqlalchemy._bulk import ItemRecord, SessionRecord, SessionWrite, bulk_for
from benchmarks.run import DEFAULT_PG
from benchmarks.stats import percentile

NAMES = TableNames("prune_bench_sessions", "prune_bench_messages")
OLD = dt.datetime(2020, 1, 1, tzinfo=dt.UTC).replace(tzinfo=None)
PAYLOAD = "x" * 120


@dataclasses.dataclass
class PruneResult:
    """One target's figures."""

    target: str
    items: int
    sessions: int
    items_deleted: int
    seconds: float
    peak_mb: float
    base_p50_ms: float
    base_p99_ms: float
    during_p50_ms: float
    during_p99_ms: float
    appends_during: int

    @property
    def items_per_s(self) -> float:
        """Items deleted per second."""
        return self.items_deleted / self.seconds

    @property
    def p99_ratio(self) -> float:
        """The appender's p99 during the prune over its p99 without."""
        return self.during_p99_ms / self.base_p99_ms


async def _fill(store: SessionStore, items: int, sessions: int) -> None:
    per = items // sessions
    bulk = bulk_for(store)
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    writes: list[SessionWrite] = []
    for s in range(sessions):
        at = OLD if s % 2 == 0 else now
        rows = [ItemRecord({"n": i, "p": PAYLOAD}, at) for i in range(per)]
        writes.append(SessionWrite(SessionRecord(f"s{s:06}", at, at, None), rows))
        if sum(len(w.items) for w in writes) >= 20_000:
            await bulk.write(writes)
            writes = []
    if writes:
        await bulk.write(writes)


async def _appender(store: SessionStore, stop: asyncio.Event, count: int | None) -> list[float]:
    """Append one item every 5 ms until ``stop`` (or ``count`` appends); latencies in ms."""
    session = store.session("probe")
    times: list[float] = []
    while not stop.is_set() and (count is None or len(times) < count):
        started = time.perf_counter()
        await session.add_items([{"probe": len(times), "p": PAYLOAD}])
        times.append((time.perf_counter() - started) * 1000)
        await asyncio.sleep(0.005)
    return times


async def run_target(target: str, url: str, items: int, sessions: int) -> PruneResult:
    """Fill, measure the appender alone, then prune with the appender running."""
    kw: dict[str, Any] = {"sessions_table": NAMES.sessions, "messages_table": NAMES.messages}
    async with SessionStore.from_url(url, create_tables=True, **kw) as store:
        await store.prune(keep_last=0)
        await store.prune(older_than=dt.timedelta(microseconds=1))
        await _fill(store, items, sessions)
        keep = max(1, items // sessions // 10)
        # warm-up, then the baseline: as many appends as the prune will roughly see
        await _appender(store, asyncio.Event(), 20)
        stop = asyncio.Event()
        tracemalloc.start()
        started = time.perf_counter()
        probe = asyncio.create_task(_appender(store, stop, None))
        report = await store.prune(older_than=dt.timedelta(days=30), keep_last=keep)
        seconds = time.perf_counter() - started
        stop.set()
        during = await probe
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        base = await _appender(store, asyncio.Event(), max(50, len(during)))
        async with store.engine.begin() as conn:  # leave no table behind on a server
            for name in (*reversed(NAMES.tables), NAMES.version_table):
                await conn.execute(DropTable(Table(name, MetaData()), if_exists=True))
    return PruneResult(
        target=target,
        items=items,
        sessions=sessions,
        items_deleted=report.items_deleted,
        seconds=seconds,
        peak_mb=peak / 2**20,
        base_p50_ms=percentile(base, 0.5),
        base_p99_ms=percentile(base, 0.99),
        during_p50_ms=percentile(during, 0.5),
        during_p99_ms=percentile(during, 0.99),
        appends_during=len(during),
    )


def _table(results: list[PruneResult]) -> str:
    lines = [
        (
            "| target | items / sessions | deleted | items/s | peak MB | appender p50 / p99 "
            "without (ms) | with prune (ms) | p99 ratio |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r.target} | {r.items:,} / {r.sessions:,} | {r.items_deleted:,} | "
        f"{r.items_per_s:,.0f} | {r.peak_mb:.1f} | {r.base_p50_ms:.2f} / {r.base_p99_ms:.2f} | "
        f"{r.during_p50_ms:.2f} / {r.during_p99_ms:.2f} | {r.p99_ratio:.2f}x |"
        for r in results
    ]
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> list[PruneResult]:
    """Run each target in turn."""
    items, sessions = (50_000, 500) if args.quick else (args.items, args.sessions)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        urls = {
            "sqlite": f"sqlite:///{Path(tmp) / 'prune.db'}",
            "postgres": args.postgres_url,
        }
        for target in args.targets.split(","):
            result = await run_target(target, urls[target], items, sessions)
            print(_table([result]).splitlines()[-1], flush=True)
            results.append(result)
    return results


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.prune", description=__doc__)
    p.add_argument("--quick", action="store_true", help="50,000 items over 500 sessions")
    p.add_argument("--items", type=int, default=1_000_000)
    p.add_argument("--sessions", type=int, default=10_000)
    p.add_argument("--targets", default="sqlite,postgres", help="sqlite,postgres")
    p.add_argument("--postgres-url", default=DEFAULT_PG)
    p.add_argument("--json", help="also write the results here")
    return p.parse_args(argv)


if __name__ == "__main__":
    arguments = parse()
    found = asyncio.run(main(arguments))
    print(_table(found))
    if arguments.json:
        Path(arguments.json).write_text(
            json.dumps([dataclasses.asdict(r) for r in found], indent=2), encoding="utf-8"
        )
