"""``python -m benchmarks.pg_grouping``: whether grouping sessions' appends pays on Postgres.

A measurement, not a feature: 64 sessions append a turn of 4 items at once, either
as 64 transactions on a pool of 10 asyncpg connections (what a store does today:
Postgres already groups concurrent commits' WAL flushes itself), or as one
transaction that upserts all 64 sessions and inserts all 256 rows in two
statements (the most a client-side group could save). Default durability
(``synchronous_commit`` as the server has it). The tables are dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import asyncpg

UPSERT = (
    "INSERT INTO pgg_s (session_id) VALUES ($1) "
    "ON CONFLICT (session_id) DO UPDATE SET updated_at = now()"
)
INSERT = (
    "INSERT INTO pgg_m (session_id, message_data) "
    "SELECT $1, d FROM unnest($2::text[]) WITH ORDINALITY AS t(d, o) ORDER BY o"
)
GROUP_UPSERT = (
    "INSERT INTO pgg_s (session_id) SELECT unnest($1::text[]) "
    "ON CONFLICT (session_id) DO UPDATE SET updated_at = now()"
)
GROUP_INSERT = (
    "INSERT INTO pgg_m (session_id, message_data) "
    "SELECT s, d FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(s, d, o) ORDER BY o"
)
SCHEMA = (
    "DROP TABLE IF EXISTS pgg_m; DROP TABLE IF EXISTS pgg_s; "
    "CREATE TABLE pgg_s (session_id text PRIMARY KEY, updated_at timestamptz DEFAULT now()); "
    "CREATE TABLE pgg_m (id bigserial PRIMARY KEY, "
    "session_id text REFERENCES pgg_s ON DELETE CASCADE, message_data text, "
    "created_at timestamptz DEFAULT now()); "
    "CREATE INDEX ON pgg_m (session_id, id)"
)


def _turn(i: int) -> list[str]:
    return [json.dumps({"role": "user", "content": "x" * 800, "i": i, "k": k}) for k in range(4)]


async def run(url: str, sessions: int, rounds: int) -> dict[str, float]:
    """Median batches/s of each way, the two alternating round by round."""
    pool = await asyncpg.create_pool(url, min_size=10, max_size=10)
    try:
        async with pool.acquire() as conn:
            await conn.execute(SCHEMA)

        async def one(sid: str, data: list[str]) -> None:
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute(UPSERT, sid)
                await conn.execute(INSERT, sid, data)

        async def grouped(batches: list[tuple[str, list[str]]]) -> None:
            sids = sorted({sid for sid, _ in batches})
            owners = [sid for sid, data in batches for _ in data]
            rows = [d for _, data in batches for d in data]
            async with pool.acquire() as conn, conn.transaction():
                await conn.execute(GROUP_UPSERT, sids)
                await conn.execute(GROUP_INSERT, owners, rows)

        rates: dict[str, list[float]] = {"64 transactions, pool of 10": [], "one grouped": []}
        for r in range(rounds):
            for way in sorted(rates, reverse=bool(r % 2)):
                batches = [(f"s{i}", _turn(i)) for i in range(sessions)]
                started = time.perf_counter()
                if way == "one grouped":
                    await grouped(batches)
                else:
                    await asyncio.gather(*(one(sid, data) for sid, data in batches))
                rates[way].append(sessions / (time.perf_counter() - started))
        async with pool.acquire() as conn:
            await conn.execute("DROP TABLE pgg_m; DROP TABLE pgg_s")
    finally:
        await pool.close()
    return {way: statistics.median(values) for way, values in rates.items()}


def main(argv: list[str] | None = None) -> int:
    """Print the median batches/s of both ways."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.pg_grouping", description=__doc__)
    p.add_argument("--url", default="postgresql://root@127.0.0.1:5432/test")
    p.add_argument("--sessions", type=int, default=64)
    p.add_argument("--rounds", type=int, default=20)
    args = p.parse_args(argv)
    for way, rate in asyncio.run(run(args.url, args.sessions, args.rounds)).items():
        print(f"{way}: {rate:,.0f} batches/s (median of {args.rounds} rounds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
