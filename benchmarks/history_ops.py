"""``python -m benchmarks.history_ops``: fork and replace of a 10,000-item session, per database.

Side by side, each against what a user would otherwise write with the session API:

* **fork** (``SessionStore.fork``: ``INSERT … SELECT`` on the database) against
  *copy through Python*: ``get_items()`` of the source, then ``add_items`` of them
  all to the new session (what ``copy``-by-hand costs; it also moves every byte
  through the client twice). ``fork_at_turn`` is ``fork(at_turn=N)`` halfway.
* **replace** (``replace_items``: one transaction) against *clear + add*
  (``clear_session`` then ``add_items``: two transactions, what the Agents SDK's
  compaction wrapper does over a session without an atomic hook, with a window in
  which the history is empty).

Items are the harness's realistic Responses items (~840 bytes on average). Median
of ``--repeats`` (ms), with the ratio to the comparison (below 1: ours is faster).
Tables are uniquely named and dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import MetaData, Table
from sqlalchemy.schema import DropTable

from agents_memory import SessionStore, create_engine
from benchmarks.items import ItemSource
from benchmarks.run import DEFAULT_MYSQL, DEFAULT_PG, DEFAULT_PGBOUNCER, pin_cpus


async def _timed(step: Callable[[], Awaitable[Any]]) -> float:
    started = time.perf_counter()
    await step()
    return (time.perf_counter() - started) * 1000


def _check(info: Any, n: int, name: str) -> None:
    """Every measured copy or swap must hold all ``n`` items (else the numbers mean nothing)."""
    if info is None or info.item_count != n:
        msg = f"{name}: expected {n} items, found {None if info is None else info.item_count}"
        raise RuntimeError(msg)


async def run_target(url: str, items: list[dict[str, Any]], repeats: int) -> dict[str, float]:
    """Median milliseconds of each operation on one database."""
    tag = uuid.uuid4().hex[:8]
    engine = create_engine(url)
    store = SessionStore(
        engine,
        sessions_table=f"bh{tag}_sessions",
        messages_table=f"bh{tag}_messages",
        create_tables=True,
    )
    times: dict[str, list[float]] = {
        k: [] for k in ("fork", "fork_at_turn", "copy_via_python", "replace", "clear_add")
    }
    half_turn = sum(1 for i in items if i.get("role") == "user") // 2
    try:
        source = store.session("source")
        await source.add_items(items)  # type: ignore[arg-type]
        n = len(items)
        for rep in range(repeats):
            times["fork"].append(await _timed(lambda rep=rep: store.fork("source", f"f{rep}")))
            times["fork_at_turn"].append(
                await _timed(lambda rep=rep: store.fork("source", f"t{rep}", at_turn=half_turn))
            )

            async def by_hand(rep: int = rep) -> None:
                await store.session(f"c{rep}").add_items(await source.get_items())

            times["copy_via_python"].append(await _timed(by_hand))
            for name in (f"f{rep}", f"c{rep}"):
                _check(await store.get_session(name), n, name)
            for name in (f"f{rep}", f"t{rep}", f"c{rep}"):
                await store.delete_session(name)

            target = store.session("target")
            await target.replace_items(items)  # type: ignore[arg-type]
            times["replace"].append(await _timed(lambda t=target: t.replace_items(items)))

            async def clear_add(t: Any = target) -> None:
                await t.clear_session()
                await t.add_items(items)

            times["clear_add"].append(await _timed(clear_add))
            _check(await store.get_session("target"), n, "target")
    finally:
        await store.close()
        async with engine.begin() as conn:
            names = store.table_names
            # every table of the set (the advanced ones refer to these), dependents first
            for table in (*reversed(names.tables), names.version_table):
                await conn.execute(DropTable(Table(table, MetaData()), if_exists=True))
        await engine.dispose()
    return {k: statistics.median(v) for k, v in times.items()}


def _print(title: str, ms: dict[str, float]) -> None:
    print(f"\n{title}")
    print("| operation | ours (ms) | by the session API (ms) | ratio |")
    print("|---|---:|---:|---:|")
    for ours, other, label in (
        ("fork", "copy_via_python", "fork vs get_items + add_items"),
        ("replace", "clear_add", "replace_items vs clear_session + add_items"),
    ):
        print(f"| {label} | {ms[ours]:.0f} | {ms[other]:.0f} | {ms[ours] / ms[other]:.2f} |")
    print(f"| fork(at_turn=half) | {ms['fork_at_turn']:.0f} | | |")


async def main_async(args: argparse.Namespace) -> None:
    """Every selected target in turn, the same items for each."""
    items = ItemSource().items(args.items)
    urls = {
        "sqlite": "sqlite+aiosqlite:///" + args.sqlite_path,
        "postgres": args.postgres_url,
        "pgbouncer": args.pgbouncer_url,
        "mysql": args.mysql_url,
    }
    for key in args.targets.split(","):
        ms = await run_target(urls[key], items, args.repeats)
        _print(f"{key}: {args.items} items, median of {args.repeats}", ms)


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, pin the CPU as the main harness does, run."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.history_ops", description=__doc__)
    p.add_argument("--targets", default="sqlite,postgres,pgbouncer,mysql")
    p.add_argument("--items", type=int, default=10_000, help="items in the session (10,000)")
    p.add_argument("--repeats", type=int, default=5, help="repeats, the median reported (5)")
    p.add_argument("--sqlite-path", default="/tmp/agents_memory_history_ops.db")  # noqa: S108
    p.add_argument("--postgres-url", default=DEFAULT_PG)
    p.add_argument("--pgbouncer-url", default=DEFAULT_PGBOUNCER)
    p.add_argument("--mysql-url", default=DEFAULT_MYSQL)
    p.add_argument("--cpu", type=int, default=1, help="pin to that many CPUs (1; -1: not)")
    args = p.parse_args(argv)
    print(pin_cpus(args.cpu))
    asyncio.run(main_async(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
