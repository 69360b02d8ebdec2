"""What the clear-generation check costs an advanced session off ``main`` (revision 0007).

``python -m benchmarks.branch_reads [--targets sqlite,postgres,pgbouncer,mysql] [--calls 200]``

One ``AdvancedSQLAlchemySession`` per target with 50 turns, and a branch ``b`` of the
first 49: ``get_items(limit=20)`` timed on ``main`` (nothing more is read) and on ``b``
(one primary-key read of the session's clear generation first), median of 5 rounds of
``--calls`` calls, in microseconds per call.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from sqlalchemy import MetaData, Table
from sqlalchemy.schema import DropTable

from agents_memory import SessionStore, TableNames, create_engine
from benchmarks.advanced import URLS
from benchmarks.workloads import check


async def per_call_us(url: str, calls: int) -> dict[str, float]:
    names = TableNames(f"b{uuid.uuid4().hex[:8]}_sessions", f"b{uuid.uuid4().hex[:8]}_messages")
    engine = create_engine(url)
    store = SessionStore(
        engine, sessions_table=names.sessions, messages_table=names.messages, create_tables=True
    )
    try:
        s = store.advanced_session("bench")
        for i in range(50):
            turn = [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}]
            await s.add_items(turn)  # type: ignore[arg-type]
        await s.create_branch_from_turn(50, "b")
        out = {}
        for branch in ("main", "b"):
            await s.switch_to_branch(branch)
            check(len(await s.get_items(limit=20)) == 20, "20 items read")
            rounds = []
            for _ in range(5):
                start = time.perf_counter()
                for _ in range(calls):
                    await s.get_items(limit=20)
                rounds.append((time.perf_counter() - start) / calls * 1e6)
            out[branch] = statistics.median(rounds)
        return out
    finally:
        await store.close()
        async with engine.begin() as conn:
            for table in (*reversed(names.tables), names.version_table):
                await conn.execute(DropTable(Table(table, MetaData()), if_exists=True))
        await engine.dispose()


async def main_async(targets: list[str], calls: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for target in targets:
            url = URLS[target] or f"sqlite+aiosqlite:///{Path(tmp) / 'branch.db'}"
            got = await per_call_us(url, calls)
            print(f"{target:10} main {got['main']:8.0f} us   branch {got['b']:8.0f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--targets", default="sqlite,postgres,mysql")
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    asyncio.run(main_async(args.targets.split(","), args.calls))


if __name__ == "__main__":
    main()
