"""``python -m benchmarks.pg_grouping``: whether grouping sessions' appends pays on Postgres.

A measurement, not a feature. Side by side in one process, interleaved round by round,
each on its own uniquely named tables (our schema) with a pool of 10:

* ``raw``: asyncpg, one autocommitted append statement per batch (``RawPostgres``);
* ``ours``: ``agents_memory.SessionStore`` (pool of 10, ``max_overflow=0``);
* ``grouped``: a realistic client-side group (``GroupedAppender`` below): leader/follower,
  one multi-session statement per group, each caller's guarantees kept;
* ``bound``: the same group statement handed all of a burst's batches at once (no queue,
  nobody waits for anybody): the most a group can save.

Workloads: 64 and 32 sessions appending a turn of 4 items at once, one writer alone
(p50/p99 of one append), and one session's append p99 while 63 others append in a loop.
Then a check (every session's items present, in order, positions 1..N) and a forced
failure (one batch of a group with a too-long session id). Last round's upper bound
(one transaction of two statements, no positions) is kept as ``--legacy-rounds``.
Default durability (``synchronous_commit`` as the server has it). Tables are dropped.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import time
import uuid
from typing import Any

import asyncpg
from sqlalchemy.dialects import postgresql

from agents_memory import SessionStore, TableNames, create_engine, get_models, migrations
from agents_memory._databases.base import compile_all
from agents_memory._databases.postgres import Postgres
from benchmarks.impls import PG_ENGINE, PG_POOL_SIZE
from benchmarks.items import ItemSource
from benchmarks.raw import RawPostgres, _no_reset, encode
from benchmarks.stats import load_average, percentile

CLOCK = "timezone('UTC', CURRENT_TIMESTAMP)"


def group_sql(names: TableNames) -> str:
    """One statement for many sessions, with ours' append semantics per session.

    The upsert takes the sessions' row locks in ``session_id`` order (so two groups never
    deadlock) and bumps each counter by its batch size; expired sessions' old items go
    (the statement's snapshot, as ours' ``x`` CTE); each row is numbered below its
    session's bumped counter. Session ids must be unique in a group (batches merged).
    """
    s, m = names.sessions, names.messages
    return (
        "WITH g AS (SELECT * FROM unnest($1::varchar[], $2::bigint[], $3::timestamp[]) "
        "AS g(sid, n, exp)), "
        f"s AS (INSERT INTO {s} AS o (session_id, expires_at, last_position) "
        "SELECT sid, exp, n FROM g ORDER BY sid "
        "ON CONFLICT (session_id) DO UPDATE SET updated_at = CURRENT_TIMESTAMP, "
        f"expires_at = coalesce(excluded.expires_at, CASE WHEN o.expires_at <= {CLOCK} "
        "THEN NULL ELSE o.expires_at END), "
        "last_position = o.last_position + excluded.last_position "
        "RETURNING o.session_id, o.last_position), "
        f"x AS (DELETE FROM {m} WHERE session_id IN (SELECT session_id FROM {s} "
        f"WHERE session_id = ANY($1::varchar[]) AND expires_at <= {CLOCK}) "
        "AND (SELECT count(*) FROM s) = cardinality($1::varchar[])) "
        f"INSERT INTO {m} (session_id, position, message_data) "
        "SELECT r.sid, s.last_position - g.n + r.o, r.d "
        "FROM unnest($4::varchar[], $5::bigint[], $6::text[]) AS r(sid, o, d) "
        "JOIN g ON g.sid = r.sid JOIN s ON s.session_id = r.sid ORDER BY r.sid, r.o"
    )


@dataclasses.dataclass
class Batch:
    """One caller's batch: its session, encoded rows, deadline, and the future it awaits."""

    sid: str
    data: list[str]
    expires: Any
    done: asyncio.Future[None]


class GroupedAppender:
    """Leader/follower grouping of appends over an asyncpg pool.

    A writer that finds no group in flight runs at once (alone: ours' own one-session
    statement). Writers arriving while a group runs queue; when it ends, the next group
    (everything queued, at most ``max_group`` batches) starts. Same-session batches of
    a group are merged in arrival order (each stays contiguous). A group statement the
    server rejects is retried batch by batch, so only a batch that fails alone fails.
    """

    def __init__(self, pool: asyncpg.Pool, names: TableNames, max_group: int = 64) -> None:
        self.pool = pool
        self.group = group_sql(names)
        c = compile_all(Postgres.statements(names, expiry=True), postgresql.asyncpg.dialect())[
            "append"
        ]
        self.single = c
        self.pending: list[Batch] = []
        self.running = False
        self.max_group = max_group
        self.sizes: list[int] = []
        self.fallbacks = 0

    async def add(self, sid: str, data: list[str], expires: Any = None) -> None:
        """Append one batch; returns once it is committed (or raises its own error)."""
        if not data:
            return
        batch = Batch(sid, data, expires, asyncio.get_running_loop().create_future())
        self.pending.append(batch)
        if not self.running:
            self.running = True
            await self._lead()
        await batch.done

    async def _lead(self) -> None:
        try:
            group, self.pending = self.pending[: self.max_group], self.pending[self.max_group :]
            self.sizes.append(len(group))
            await self._run(group)
        finally:
            if self.pending:
                asyncio.get_running_loop().create_task(self._lead())
            else:
                self.running = False

    async def _one(self, b: Batch) -> None:
        c = self.single
        args = c.positional({"sid": b.sid, "data": b.data, "expires": b.expires, "n": len(b.data)})
        await self.pool.execute(c.sql, *args)

    async def _run(self, group: list[Batch]) -> None:
        try:
            if len(group) == 1:
                await self._one(group[0])
            else:
                await self.statement(group)
        except asyncpg.PostgresError as exc:
            if len(group) == 1:
                _settle(group[0].done, exc)
                return
            self.fallbacks += 1
            await self._alone(group)
            return
        except BaseException as exc:  # outcome unknown (connection lost): tell everyone
            for b in group:
                _settle(b.done, exc)
            raise
        for b in group:
            _settle(b.done, None)

    async def statement(self, group: list[Batch]) -> None:
        """The group statement for ``group`` (same-session batches merged in order)."""
        merged: dict[str, list[Batch]] = {}
        for b in group:
            merged.setdefault(b.sid, []).append(b)
        sids = sorted(merged)
        ns, exps, owners, ords, rows = [], [], [], [], []
        for sid in sids:
            data = [d for b in merged[sid] for d in b.data]
            ns.append(len(data))
            exps.append(merged[sid][-1].expires)
            owners += [sid] * len(data)
            ords += range(1, len(data) + 1)
            rows += data
        await self.pool.execute(self.group, sids, ns, exps, owners, ords, rows)

    async def _alone(self, group: list[Batch]) -> None:
        by_session: dict[str, list[Batch]] = {}
        for b in group:
            by_session.setdefault(b.sid, []).append(b)

        async def session(batches: list[Batch]) -> None:
            for b in batches:  # in arrival order
                try:
                    await self._one(b)
                except Exception as exc:
                    _settle(b.done, exc)
                else:
                    _settle(b.done, None)

        await asyncio.gather(*(session(bs) for bs in by_session.values()))


def _settle(fut: asyncio.Future[None], exc: BaseException | None) -> None:
    if not fut.done():
        if exc is None:
            fut.set_result(None)
        else:
            fut.set_exception(exc)


# -- the implementations ------------------------------------------------------------------------


class Impl:
    """``add(sid, items)`` for the workloads; ``burst`` for the bound."""

    def __init__(self, key: str, names: TableNames) -> None:
        self.key = key
        self.names = names
        self.expected: dict[str, list[Any]] = {}

    def note(self, sid: str, items: list[Any]) -> None:
        """Remember what ``sid`` was given, in order, for the check."""
        self.expected.setdefault(sid, []).extend(items)


async def build(url: str, tag: str, bouncer: bool) -> tuple[list[Any], list[Any]]:
    cache = 0 if bouncer else 100
    impls: list[Any] = []
    closers: list[Any] = []
    for key in ("raw", "ours", "grouped", "bound"):
        names = TableNames(f"pgg_{tag}_{key}_sessions", f"pgg_{tag}_{key}_messages")
        impl = Impl(key, names)
        sa_url = url.replace("postgresql://", "postgresql+asyncpg://", 1)
        if key == "ours":
            engine = create_engine(sa_url, **PG_ENGINE)
            kw = {"sessions_table": names.sessions, "messages_table": names.messages}
            await migrations.upgrade(engine, **kw)
            store = SessionStore(engine, **kw)
            sessions: dict[str, Any] = {}

            async def add_ours(
                sid: str, items: list[Any], st: Any = store, ss: Any = sessions
            ) -> None:
                s = ss.get(sid) or ss.setdefault(sid, st.session(sid))
                await s.add_items(items)

            impl.add = add_ours

            async def close_ours(st: Any = store, e: Any = engine) -> None:
                await st.close()
                await e.dispose()

            closers.append(close_ours)
        else:
            ddl = create_engine(sa_url, connect_args={"statement_cache_size": 0} if bouncer else {})
            async with ddl.begin() as conn:
                await conn.run_sync(get_models(names).metadata.create_all)
            await ddl.dispose()
            if key == "raw":
                raw = RawPostgres(url, names, PG_POOL_SIZE, statement_cache_size=cache)
                await raw.open()

                async def add_raw(sid: str, items: list[Any], r: Any = raw) -> None:
                    await r.add(sid, encode(items))

                impl.add = add_raw
                closers.append(raw.close)
            else:
                pool = await asyncpg.create_pool(
                    url,
                    min_size=PG_POOL_SIZE,
                    max_size=PG_POOL_SIZE,
                    reset=_no_reset,
                    statement_cache_size=cache,
                )
                g = GroupedAppender(pool, names)
                impl.appender = g

                async def add_grouped(sid: str, items: list[Any], a: Any = g) -> None:
                    await a.add(sid, encode(items))

                async def burst(batches: list[tuple[str, list[Any]]], a: Any = g) -> None:
                    await a.statement(
                        [Batch(s, encode(i), None, asyncio.Future()) for s, i in batches]
                    )

                impl.add = add_grouped
                impl.burst = burst
                closers.append(pool.close)
        impls.append(impl)
    return impls, closers


# -- workloads --------------------------------------------------------------------------------


async def burst(impl: Any, n: int, items: ItemSource) -> float:
    """``n`` sessions append a turn at once; the seconds it took."""
    batches = [(f"b{n}-{i}", items.turn()) for i in range(n)]
    started = time.perf_counter()
    if impl.key == "bound":
        await impl.burst(batches)
    else:
        await asyncio.gather(*(impl.add(s, t) for s, t in batches))
    took = time.perf_counter() - started
    for s, t in batches:
        impl.note(s, t)
    return took


async def sequential(impl: Any, n: int, items: ItemSource, sid: str = "alone") -> list[float]:
    """Latencies of ``n`` appends of one session, one after another."""
    out = []
    for _ in range(n):
        t = items.turn()
        started = time.perf_counter()
        await impl.add(sid, t)
        out.append(time.perf_counter() - started)
        impl.note(sid, t)
    return out


async def probed(impl: Any, n: int, items: ItemSource) -> list[float]:
    """One session's append latencies while 63 others append in a loop."""
    stop = False

    async def background(sid: str) -> None:
        while not stop:
            t = items.turn()
            await impl.add(sid, t)
            impl.note(sid, t)

    tasks = [asyncio.create_task(background(f"bg-{i}")) for i in range(63)]
    await asyncio.sleep(0.02)
    try:
        out = await sequential(impl, n, items, sid="probe")
    finally:
        stop = True
        await asyncio.gather(*tasks)
    return out


async def check(url: str, impls: list[Any], cache: int) -> list[str]:
    """Every session's items present, in order, positions 1..N (then the forced failure)."""
    problems = []
    conn = await asyncpg.connect(url, statement_cache_size=cache)
    try:
        for impl in impls:
            for sid, want in impl.expected.items():
                rows = await conn.fetch(
                    f"SELECT position, message_data FROM {impl.names.messages} "
                    "WHERE session_id = $1 ORDER BY position",
                    sid,
                )
                got = [json.loads(r[1]) for r in rows]
                if [r[0] for r in rows] != list(range(1, len(want) + 1)) or got != want:
                    problems.append(f"{impl.key} {sid}: {len(rows)} rows, {len(want)} expected")
    finally:
        await conn.close()
    return problems


async def forced_failure(impl: Any, items: ItemSource) -> str:
    """16 batches at once: the first alone, 15 behind it as a group.

    Two of the 15 are one session's; one has a session id too long (255 at most).
    """
    g = impl.appender
    bad = "x" * 256
    sids = ["ff-lead", "ff-0", "ff-0"] + [f"ff-{i}" for i in range(1, 13)] + [bad]
    turns = [items.turn() for _ in sids]
    before = (len(g.sizes), g.fallbacks)
    results = await asyncio.gather(
        *(impl.add(s, t) for s, t in zip(sids, turns, strict=True)), return_exceptions=True
    )
    for s, t, r in zip(sids, turns, results, strict=True):
        if r is None:
            impl.note(s, t)
    failed = [type(r).__name__ for r in results if r is not None]
    return (
        f"{len(sids)} batches in groups of {g.sizes[before[0] :]}, "
        f"group fallbacks {g.fallbacks - before[1]}, failed: {failed}"
    )


async def repeat(
    impls: list[Any],
    rep: int,
    args: argparse.Namespace,
    *,
    items: ItemSource,
    rates: dict[tuple[str, str], list[float]],
    lat: dict[tuple[str, str], list[float]],
) -> None:
    """One repeat: ``args.rounds`` rounds, the implementations interleaved (order alternating)."""
    spent: dict[tuple[str, str], float] = {}
    ops: dict[tuple[str, str], int] = {}
    for r in range(args.rounds):
        order = impls if (rep + r) % 2 == 0 else impls[::-1]
        for impl in order:
            k = impl.key
            for n in (64, 32):
                took = await burst(impl, n, items)
                spent[k, f"{n}"] = spent.get((k, f"{n}"), 0) + took
                ops[k, f"{n}"] = ops.get((k, f"{n}"), 0) + n
            if k == "bound":
                continue
            seq = await sequential(impl, args.sequential, items)
            spent[k, "seq"] = spent.get((k, "seq"), 0) + sum(seq)
            ops[k, "seq"] = ops.get((k, "seq"), 0) + len(seq)
            lat.setdefault((k, "seq"), []).extend(seq)
            lat.setdefault((k, "probe"), []).extend(await probed(impl, 10, items))
    for key, sec in spent.items():
        rates.setdefault(key, []).append(ops[key] / sec)


async def realistic(args: argparse.Namespace) -> None:
    items = ItemSource()
    tag = uuid.uuid4().hex[:8]
    cache = 0 if args.pgbouncer else 100
    print(f"before: {load_average()}  url {args.url}  tag {tag}")
    impls, closers = await build(args.url, tag, args.pgbouncer)
    rates: dict[tuple[str, str], list[float]] = {}
    lat: dict[tuple[str, str], list[float]] = {}
    try:
        for impl in impls:  # warm-up, untimed
            await burst(impl, 64, items)
            if impl.key != "bound":
                await sequential(impl, 5, items)
        for rep in range(args.repeats):
            await repeat(impls, rep, args, items=items, rates=rates, lat=lat)
        problems = await check(args.url, impls, cache)
        failure = await forced_failure(impls[2], items)
        problems += await check(args.url, impls[2:3], cache)
    finally:
        for close in closers:
            await close()
        conn = await asyncpg.connect(args.url, statement_cache_size=0)
        try:
            for impl in impls:
                for t in (*reversed(impl.names.tables), impl.names.version_table):
                    await conn.execute(f"DROP TABLE IF EXISTS {t}")
        finally:
            await conn.close()
    print(f"after: {load_average()}  ({args.repeats} repeats x {args.rounds} rounds)")
    report(impls, rates, lat)
    print(f"check: {'ok' if not problems else problems[:5]}")
    print(f"forced failure: {failure}")


def report(
    impls: list[Any],
    rates: dict[tuple[str, str], list[float]],
    lat: dict[tuple[str, str], list[float]],
) -> None:
    """The table: median ops/s with ratios, latencies, the groups' sizes."""
    med = {key: statistics.median(v) for key, v in rates.items()}
    print(
        "| impl | 64 at once ops/s | 32 at once | alone ops/s | alone p50/p99 ms | probe p99 ms |"
    )
    print("|---|---|---|---|---|---|")
    for impl in impls:
        k = impl.key
        cells = []
        for w in ("64", "32", "seq"):
            if (k, w) not in med:
                cells.append("-")
                continue
            v = med[k, w]
            cells.append(f"{v:,.0f} ({v / med['raw', w]:.2f}x raw, {v / med['ours', w]:.2f}x ours)")
        if k == "bound":
            cells += ["-", "-"]
        else:
            s, p = lat[k, "seq"], lat[k, "probe"]
            cells.append(f"{percentile(s, 0.5) * 1e3:.2f} / {percentile(s, 0.99) * 1e3:.2f}")
            cells.append(f"{percentile(p, 0.99) * 1e3:.1f}")
        print(f"| {k} | " + " | ".join(cells) + " |")
    g = impls[2].appender
    print(f"grouped: {len(g.sizes)} groups, mean size {statistics.mean(g.sizes):.1f}")


# -- last round's upper bound (its own tables, no positions) ------------------------------------


def legacy_sql(tag: str) -> dict[str, str]:
    s, m = f"pgg_{tag}_s", f"pgg_{tag}_m"
    return {
        "upsert": f"INSERT INTO {s} (session_id) VALUES ($1) "
        "ON CONFLICT (session_id) DO UPDATE SET updated_at = now()",
        "insert": f"INSERT INTO {m} (session_id, message_data) "
        "SELECT $1, d FROM unnest($2::text[]) WITH ORDINALITY AS t(d, o) ORDER BY o",
        "group_upsert": f"INSERT INTO {s} (session_id) SELECT unnest($1::text[]) "
        "ON CONFLICT (session_id) DO UPDATE SET updated_at = now()",
        "group_insert": f"INSERT INTO {m} (session_id, message_data) "
        "SELECT s, d FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(s, d, o) ORDER BY o",
        "schema": f"CREATE TABLE {s} (session_id text PRIMARY KEY, updated_at timestamptz "
        f"DEFAULT now()); CREATE TABLE {m} (id bigserial PRIMARY KEY, "
        f"session_id text REFERENCES {s} ON DELETE CASCADE, message_data text, "
        f"created_at timestamptz DEFAULT now()); CREATE INDEX ON {m} (session_id, id)",
        "drop": f"DROP TABLE IF EXISTS {m}; DROP TABLE IF EXISTS {s}",
    }


def _turn(i: int) -> list[str]:
    return [json.dumps({"role": "user", "content": "x" * 800, "i": i, "k": k}) for k in range(4)]


async def run(url: str, sessions: int, rounds: int, cache: int = 100) -> dict[str, float]:
    """Median batches/s of each way, the two alternating round by round."""
    sql = legacy_sql(uuid.uuid4().hex[:8])
    pool = await asyncpg.create_pool(url, min_size=10, max_size=10, statement_cache_size=cache)
    try:
        async with pool.acquire() as conn:
            await conn.execute(sql["schema"])
        try:

            async def one(sid: str, data: list[str]) -> None:
                async with pool.acquire() as conn, conn.transaction():
                    await conn.execute(sql["upsert"], sid)
                    await conn.execute(sql["insert"], sid, data)

            async def grouped(batches: list[tuple[str, list[str]]]) -> None:
                sids = sorted({sid for sid, _ in batches})
                owners = [sid for sid, data in batches for _ in data]
                rows = [d for _, data in batches for d in data]
                async with pool.acquire() as conn, conn.transaction():
                    await conn.execute(sql["group_upsert"], sids)
                    await conn.execute(sql["group_insert"], owners, rows)

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
        finally:
            async with pool.acquire() as conn:
                await conn.execute(sql["drop"])
    finally:
        await pool.close()
    return {way: statistics.median(values) for way, values in rates.items()}


def main(argv: list[str] | None = None) -> int:
    """Print the realistic comparison, then last round's upper bound."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.pg_grouping", description=__doc__)
    p.add_argument("--url", default="postgresql://root@127.0.0.1:5432/test")
    p.add_argument("--pgbouncer", action="store_true", help="the URL is a transaction pooler")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sequential", type=int, default=20, help="appends per round, writer alone")
    p.add_argument("--legacy-rounds", type=int, default=10)
    args = p.parse_args(argv)
    asyncio.run(realistic(args))
    if args.legacy_rounds:
        cache = 0 if args.pgbouncer else 100
        res = asyncio.run(run(args.url, 64, args.legacy_rounds, cache))
        for way, rate in res.items():
            print(f"legacy bound, {way}: {rate:,.0f} batches/s (median of {args.legacy_rounds})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
