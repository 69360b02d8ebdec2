"""``python -m benchmarks.expiry``: what expiry costs the hot path, A/B in one process.

On migrated tables (which have ``expires_at``) the store runs the expiry variant
of its statements: reads and pops probe the session row's deadline, an append
renews it or starts an expired session afresh. Tables never migrated keep the
plain statements (main's before expiry). This runs the variants in one process,
alternating rounds so drift and load hit them alike:

* ``plain``: the statements without expiry (``Database.statements(expiry=False)``),
  since revision 0006 the legacy ones, so on tables of the Agents SDK's shape (items
  keyed by a global ``id``, ``models.legacy_tables``) beside the migrated ones;
* ``expiry``: the variant, ``ttl`` off (what every migrated store runs);
* ``ttl``: the variant with a store ``ttl`` (each append also sets the deadline).

Operations, each on one session per round: ``add_items`` of one item,
``get_items(limit=20)`` of a 200-item session, ``pop_item`` then ``add_items``
(a pop needs something to pop). Reported: the median per-operation time of the
rounds, and each variant's ratio to ``plain`` (>1: slower).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from sqlalchemy import MetaData, Table
from sqlalchemy.schema import DropTable

from agents_memory import SessionStore, TableNames
from agents_memory._sqlalchemy._store import backend_of
from agents_memory.models import legacy_tables
from benchmarks.run import DEFAULT_MYSQL, DEFAULT_PG

NAMES = TableNames("expiry_bench_sessions", "expiry_bench_messages")
LEGACY = TableNames("expiry_bench_sdk_sessions", "expiry_bench_sdk_messages")
"""Tables the Agents SDK would make (never migrated): where the plain statements run."""
VARIANTS = ("plain", "expiry", "ttl")


def _use(store: SessionStore, variant: str) -> None:
    """Point the migrated store's backend at ``expiry`` or ``ttl`` (the only private reach)."""
    backend = backend_of(store)
    backend.expiry = True
    backend.ttl = dt.timedelta(hours=1) if variant == "ttl" else None
    backend._ops.clear()  # noqa: SLF001 - rebuilt for the chosen variant


async def _time(op: Callable[[], Awaitable[object]], n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        await op()
    return (time.perf_counter() - started) / n * 1e6


async def run_target(url: str, rounds: int, n: int) -> dict[str, dict[str, float]]:
    """Median microseconds per operation, by operation and variant."""
    samples: dict[str, dict[str, list[float]]] = {}
    async with SessionStore.from_url(
        url, create_tables=True, sessions_table=NAMES.sessions, messages_table=NAMES.messages
    ) as store:
        async with store.engine.begin() as conn:
            await conn.run_sync(legacy_tables(LEGACY)[0].metadata.create_all)
        legacy = SessionStore(
            store.engine, sessions_table=LEGACY.sessions, messages_table=LEGACY.messages
        )
        try:
            readers = {}
            for which in (store, legacy):
                reader = readers[which] = which.session("reader")
                await reader.clear_session()
                await reader.add_items([{"role": "user", "content": f"m{i}"} for i in range(200)])
            for r in range(rounds):
                order = VARIANTS if r % 2 == 0 else tuple(reversed(VARIANTS))
                for variant in order:
                    on = legacy if variant == "plain" else store
                    if on is store:
                        _use(store, variant)
                    reader = readers[on]
                    s = on.session(f"w-{variant}")
                    item = [{"role": "user", "content": "hello"}]
                    await s.add_items(item)  # warm (prepared statements, connections)
                    ops: dict[str, Callable[[], Awaitable[object]]] = {
                        "add_items(1)": lambda s=s, item=item: s.add_items(item),
                        "get_items(20)": lambda reader=reader: reader.get_items(limit=20),
                        "pop_item": s.pop_item,
                    }
                    for name, op in ops.items():
                        us = await _time(op, n)
                        samples.setdefault(name, {}).setdefault(variant, []).append(us)
        finally:
            _use(store, "expiry")
            async with store.engine.begin() as conn:  # leave no table behind
                names = (*reversed(NAMES.tables), NAMES.version_table, *reversed(LEGACY.tables))
                for name in names:
                    await conn.execute(DropTable(Table(name, MetaData()), if_exists=True))
    return {op: {v: statistics.median(xs) for v, xs in per.items()} for op, per in samples.items()}


def _table(target: str, result: dict[str, dict[str, float]]) -> str:
    lines = [
        f"{target}: median µs per operation (ratio to plain)",
        "| operation | plain | expiry, ttl off | ttl on |",
        "|---|---|---|---|",
    ]
    for op, per in result.items():
        base = per["plain"]
        lines.append(
            f"| {op} | {base:,.0f} | {per['expiry']:,.0f} ({per['expiry'] / base:.2f}x) | "
            f"{per['ttl']:,.0f} ({per['ttl'] / base:.2f}x) |"
        )
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> None:
    """Each target in turn."""
    with tempfile.TemporaryDirectory() as tmp:
        urls = {
            "sqlite": f"sqlite:///{Path(tmp) / 'expiry.db'}",
            "postgres": args.postgres_url,
            "mysql": args.mysql_url,
        }
        for target in args.targets.split(","):
            result = await run_target(urls[target], args.rounds, args.n)
            print(_table(target, result), flush=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.expiry", description=__doc__)
    p.add_argument("--targets", default="sqlite,postgres", help="sqlite,postgres,mysql")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("-n", type=int, default=200, help="operations per round and variant")
    p.add_argument("--postgres-url", default=DEFAULT_PG)
    p.add_argument("--mysql-url", default=DEFAULT_MYSQL)
    return p.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse()))
