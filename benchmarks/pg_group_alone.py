"""``python -m benchmarks.pg_group_alone URL [ROUNDS] [on|off]``: grouping's cost to a writer alone.

Postgres group commit for appends (``_databases/postgres_groups.py``) must cost a
writer alone nothing: with a pooled connection free it runs today's statement at once.
Two engines on one server in one process, one with ``agents_memory_group_commit``
as the third argument says (``on``, the default; ``off`` gives an A/A run that shows
the noise), the other with it off; interleaved rounds of 200 appends of a turn of four
items to one session; ops/s as the median over rounds. Pin it (``taskset -c 0``).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid
from typing import Any

from sqlalchemy import MetaData, Table
from sqlalchemy.schema import DropTable

from agents_memory import SessionStore, create_engine
from agents_memory._databases.base import GROUP_COMMIT_OPTION

APPENDS = 200


async def main(url: str, rounds: int, first_on: bool) -> None:
    stores: dict[str, SessionStore] = {}
    engines: list[Any] = []
    for key, on in (("a", first_on), ("b", False)):
        engine = create_engine(
            url, execution_options={GROUP_COMMIT_OPTION: on}, pool_size=10, max_overflow=0
        )
        engines.append(engine)
        tag = uuid.uuid4().hex[:8]
        stores[key] = SessionStore(
            engine, sessions_table=f"ab{tag}_s", messages_table=f"ab{tag}_m", create_tables=True
        )
    turn = [{"type": "message", "role": "user", "content": "x" * 200} for _ in range(4)]
    rates: dict[str, list[float]] = {"a": [], "b": []}
    try:
        for s in stores.values():
            for _ in range(50):
                await s.session("warm").add_items(turn)
        for r in range(rounds):
            for key in ("a", "b") if r % 2 == 0 else ("b", "a"):
                session = stores[key].session(f"r{r}")
                started = time.perf_counter()
                for _ in range(APPENDS):
                    await session.add_items(turn)
                rates[key].append(APPENDS / (time.perf_counter() - started))
    finally:
        for s in stores.values():
            names = s.table_names
            async with s.engine.begin() as conn:
                for table in (*reversed(names.tables), names.version_table):
                    await conn.execute(DropTable(Table(table, MetaData()), if_exists=True))
            await s.close()
        for engine in engines:
            await engine.dispose()
    a, b = statistics.median(rates["a"]), statistics.median(rates["b"])
    label = "on" if first_on else "off"
    print(
        f"{url}: {APPENDS} appends x {rounds} rounds alone: {label} {a:.0f} ops/s, off {b:.0f} "
        f"ops/s, {label} / off {a / b:.3f}"
    )


if __name__ == "__main__":
    asyncio.run(
        main(
            sys.argv[1],
            int(sys.argv[2]) if len(sys.argv) > 2 else 30,
            (sys.argv[3] if len(sys.argv) > 3 else "on") == "on",
        )
    )
