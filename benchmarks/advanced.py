"""Advanced sessions on a long conversation: turns listing and usage totals.

``python -m benchmarks.advanced [--targets sqlite,postgres,pgbouncer,mysql] [--turns 10000]``

Fills one ``AdvancedSQLAlchemySession`` per target with ``--turns`` user turns (a
question and an answer each, 100 turns per ``add_items``) and a usage row per
turn, then times ``get_conversation_turns()`` (every turn, with its text) and
``get_session_usage()`` (one aggregate), median of ``--repeats``. On SQLite the
Agents SDK's own ``AdvancedSQLiteSession`` runs the same workload beside ours.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sqlalchemy import MetaData, Table, insert
from sqlalchemy.schema import DropTable

from agents_memory import SessionStore, TableNames, create_engine, get_models
from benchmarks.workloads import check

URLS = {
    "sqlite": None,
    "postgres": os.environ.get(
        "AGENTS_MEMORY_BENCH_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test"
    ),
    "pgbouncer": os.environ.get(
        "AGENTS_MEMORY_BENCH_PGBOUNCER_URL", "postgresql://root@127.0.0.1:6432/test"
    ),
    "mysql": os.environ.get("AGENTS_MEMORY_BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306/test"),
}
BATCH = 100


def turn_items(first: int, n: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for i in range(first, first + n):
        items.append({"role": "user", "content": f"question {i}: " + "x" * 200})
        items.append({"role": "assistant", "content": [{"type": "output_text", "text": "y" * 400}]})
    return items


async def median_ms(fn: Callable[[], Awaitable[Any]], repeats: int) -> float:
    await fn()  # warm
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        await fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def usage_rows(sid: str, turns: int) -> list[dict[str, Any]]:
    return [
        {
            "session_id": sid,
            "branch_id": "main",
            "user_turn_number": t,
            "requests": 1,
            "input_tokens": 100,
            "output_tokens": 10,
            "total_tokens": 110,
        }
        for t in range(1, turns + 1)
    ]


async def ours(url: str, turns: int, repeats: int) -> tuple[float, float]:
    names = TableNames(f"b{uuid.uuid4().hex[:8]}_sessions", f"b{uuid.uuid4().hex[:8]}_messages")
    engine = create_engine(url)
    store = SessionStore(
        engine, sessions_table=names.sessions, messages_table=names.messages, create_tables=True
    )
    try:
        s = store.advanced_session("long")
        for first in range(1, turns + 1, BATCH):
            await s.add_items(turn_items(first, min(BATCH, turns + 1 - first)))  # type: ignore[arg-type]
        usage = get_models(names).TurnUsage.__table__
        async with engine.begin() as conn:
            await conn.execute(insert(usage), usage_rows("long", turns))
        check(len(await s.get_conversation_turns()) == turns, "every turn listed")
        check((await s.get_session_usage() or {}).get("total_turns") == turns, "usage rows")
        return (
            await median_ms(s.get_conversation_turns, repeats),
            await median_ms(s.get_session_usage, repeats * 4),
        )
    finally:
        await store.close()
        async with engine.begin() as conn:
            for table in (*reversed(names.tables), names.version_table):
                await conn.execute(DropTable(Table(table, MetaData()), if_exists=True))
        await engine.dispose()


async def sdk(path: Path, turns: int, repeats: int) -> tuple[float, float]:
    from agents.extensions.memory import AdvancedSQLiteSession  # noqa: PLC0415

    s = AdvancedSQLiteSession(session_id="long", db_path=path, create_tables=True)
    try:
        for first in range(1, turns + 1, BATCH):
            await s.add_items(turn_items(first, min(BATCH, turns + 1 - first)))  # type: ignore[arg-type]
        conn = sqlite3.connect(path)
        conn.executemany(
            "INSERT INTO turn_usage (session_id, branch_id, user_turn_number, requests, "
            "input_tokens, output_tokens, total_tokens) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [tuple(r.values()) for r in usage_rows("long", turns)],
        )
        conn.commit()
        conn.close()
        check(len(await s.get_conversation_turns()) == turns, "every turn listed (SDK)")
        return (
            await median_ms(s.get_conversation_turns, repeats),
            await median_ms(s.get_session_usage, repeats * 4),
        )
    finally:
        s.close()


async def main_async(targets: list[str], turns: int, repeats: int) -> None:
    print(f"{turns} turns ({2 * turns} items); median of {repeats} (usage: {repeats * 4}) runs")
    print(f"{'target':<22} {'get_conversation_turns ms':>26} {'get_session_usage ms':>22}")
    with tempfile.TemporaryDirectory() as tmp:
        for target in targets:
            url = URLS[target] or f"sqlite:///{Path(tmp) / 'ours.db'}"
            try:
                turns_ms, usage_ms = await ours(url, turns, repeats)
            except OSError as exc:
                print(f"{target:<22} skipped: {exc}")
                continue
            print(f"{'ours ' + target:<22} {turns_ms:>26.1f} {usage_ms:>22.2f}")
            if target == "sqlite":
                turns_ms, usage_ms = await sdk(Path(tmp) / "sdk.db", turns, repeats)
                print(f"{'sdk AdvancedSQLite':<22} {turns_ms:>26.1f} {usage_ms:>22.2f}")


def main() -> None:
    """Parse the flags and run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="sqlite,postgres,pgbouncer,mysql")
    parser.add_argument("--turns", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main_async(args.targets.split(","), args.turns, args.repeats))


if __name__ == "__main__":
    main()
