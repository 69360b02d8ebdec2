"""Behind PgBouncer in transaction pooling mode, reads never change data.

The bug report's scenario: two OS processes share one PgBouncer. Process B keeps
appending to, reading and clearing *other* sessions; process A only reads the session
``victim`` (200 items). PgBouncer hands each transaction whichever server connection is
free, so a statement prepared by one process can be found, under the same name, by the
other; if a read ever executed B's ``clear_session`` statement, ``victim`` would lose its
items. Afterwards the database itself (through a fresh engine whose prepared statements
have unique names and are never reused) must still hold ``victim``'s 200 items in order,
every read of A must have returned exactly those 200 items, and neither process may have
seen an error. Shared counters prove the race happened: each process ran many operations
while the other was making progress. The schema and ``victim`` are set up through that
same safe engine (``migrations.upgrade`` and a ``SessionStore`` on it), so only the two
processes, which use ``SessionStore.from_url`` as an application would, are under test.

Runs only for the ``pgbouncer`` backend (``AGENTS_MEMORY_TEST_DB=pgbouncer``; start the
bouncer with ``bash .ci/pgbouncer``).
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import uuid
from collections.abc import AsyncIterator
from typing import Any

import _pgbouncer_race as race
import pytest
from sqlalchemy import MetaData, Table, select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from agents_memory import SessionStore, TableNames, migrations

MIN_OPS = 20  # operations each process must finish (either way) for the run to count as a race
MIN_OVERLAP = 10  # operations of one process that must happen while the other one runs
JOIN_TIMEOUT = 120.0  # seconds for a child to start, race and report


@pytest.fixture
def bouncer(backend: Any) -> Any:
    """The pgbouncer backend only: the scenario is about PgBouncer's transaction pooling."""
    if backend.id != "pgbouncer":
        pytest.skip("only through PgBouncer in transaction pooling mode (AGENTS_MEMORY_TEST_DB)")
    return backend


@pytest.fixture
async def checker(bouncer: Any) -> AsyncIterator[AsyncEngine]:
    """An engine on the bouncer that is safe behind it whatever the library does.

    No pool and no statement caches, and every prepared statement gets a unique name, so
    no statement of this engine can be confused with one prepared by another client.
    """
    url = make_url(bouncer.url).set(drivername="postgresql+asyncpg")
    engine = create_async_engine(
        url,
        poolclass=NullPool,
        connect_args={
            "statement_cache_size": 0,
            "prepared_statement_cache_size": 0,
            "prepared_statement_name_func": lambda: f"__am_check_{uuid.uuid4().hex}__",
        },
    )
    yield engine
    await engine.dispose()


async def stored_items(engine: AsyncEngine, names: TableNames, session_id: str) -> list[Any]:
    """The session's items as the database holds them, oldest first (decoded JSON)."""
    async with engine.connect() as conn:
        messages = await conn.run_sync(
            lambda sync: Table(names.messages, MetaData(), autoload_with=sync)
        )
        rows = await conn.execute(
            select(messages.c.message_data)
            .where(messages.c.session_id == session_id)
            .order_by(messages.c.position)
        )
        return [json.loads(data) for (data,) in rows]


async def race_two_processes(url: str, names: TableNames) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run process A (reader) and B (churner) against ``url`` at once; return their summaries."""
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    a_ops, b_ops = ctx.Value("q", 0), ctx.Value("q", 0)
    tables = (names.sessions, names.messages)
    a_in, a_out = ctx.Pipe(duplex=False)
    b_in, b_out = ctx.Pipe(duplex=False)
    procs = [
        ctx.Process(target=race.reader, args=(url, tables, (go, a_ops, b_ops), a_out), daemon=True),
        ctx.Process(
            target=race.churner, args=(url, tables, (go, b_ops, a_ops), b_out), daemon=True
        ),
    ]
    for p in procs:
        p.start()
    a_out.close()
    b_out.close()
    pipes = {"A (reader)": a_in, "B (churner)": b_in}

    async def receive(name: str) -> Any:
        ready = await asyncio.to_thread(pipes[name].poll, JOIN_TIMEOUT)
        assert ready, f"process {name} sent nothing within {JOIN_TIMEOUT}s"
        try:
            return pipes[name].recv()
        except EOFError:
            pytest.fail(f"process {name} died (its traceback is in the captured stderr)")

    try:
        for name in pipes:
            assert await receive(name) == "ready"
        go.set()  # both have imported everything and opened their store: race now
        summaries = [await receive(name) for name in pipes]
        for p in procs:
            await asyncio.to_thread(p.join, JOIN_TIMEOUT)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
        a_in.close()
        b_in.close()
    return summaries[0], summaries[1]


async def test_reads_never_change_data_across_processes(
    bouncer: Any, names: TableNames, checker: AsyncEngine
) -> None:
    """A process that only reads ``victim`` never loses it to another process's clears."""
    await migrations.upgrade(checker, sessions_table=names.sessions, messages_table=names.messages)
    seed = SessionStore(checker, sessions_table=names.sessions, messages_table=names.messages)
    await seed.session(race.VICTIM).add_items(race.victim_items())
    await seed.close()
    before = await stored_items(checker, names, race.VICTIM)
    assert before == race.victim_items(), "the seed itself did not store 200 items in order"

    a, b = await race_two_processes(bouncer.url, names)
    after = await stored_items(checker, names, race.VICTIM)

    problems = []
    if after != race.victim_items():
        problems.append(
            f"victim holds {len(after)} items after process A only read it (200 before)"
        )
    if a["lengths"] != {race.VICTIM_ITEMS: a["ops"] - a["errors"]}:
        problems.append(f"A's reads returned these item counts (items: reads): {a['lengths']}")
    if a["out_of_order"]:
        problems.append(f"{a['out_of_order']} of A's reads had 200 items, not in order")
    if a["errors"] or b["errors"]:
        problems.append(f"operations failed: {a['errors']} reads of A, {b['errors']} of B's")
    # The race happened: both did many operations, each while the other made progress.
    for name, mine in (("A", a), ("B", b)):
        if mine["ops"] <= MIN_OPS or mine["other_progress"] < MIN_OVERLAP:
            problems.append(
                f"no race: {name} finished {mine['ops']} operations (> {MIN_OPS} needed), "
                f"{mine['other_progress']} of the other's while it ran (>= {MIN_OVERLAP} needed)"
            )
    assert not problems, "\n".join([*problems, f"A (reader): {a}", f"B (churner): {b}"])
