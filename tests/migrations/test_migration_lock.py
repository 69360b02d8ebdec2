"""The migration lock where advisory locks do not work: a row of ``<sessions>_migration_lock``.

Real migrator processes (``_migrator.py``), real servers. Every wait is proven
(the waiter seen in ``pg_locks`` or MariaDB's processlist; on SQLite, the
waiter says it reached ``BEGIN IMMEDIATE`` while the holder holds the file),
never assumed from a delay.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import MetaData, Table, func, inspect, select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory import TableNames, create_engine, migrations
from agents_memory._migrations import _lock
from agents_memory.models import migration_lock_table

MIGRATOR = Path(__file__).with_name("_migrator.py")
WAIT_S = 240.0
"""How long a test waits for something it must see happen (a bound, never a window)."""


def kw(names: TableNames) -> dict[str, str]:
    return {"sessions_table": names.sessions, "messages_table": names.messages}


def start(url: str, names: TableNames, lock: str, *, pause: bool) -> subprocess.Popen[str]:
    return subprocess.Popen(  # noqa: S603 - a fixed argument list
        [
            sys.executable,
            str(MIGRATOR),
            url,
            names.sessions,
            names.messages,
            lock,
            "pause" if pause else "go",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def until(proc: subprocess.Popen[str], wanted: str) -> None:
    """Read the process's stdout up to the line ``wanted`` (EOF first is a failure)."""
    assert proc.stdout is not None
    while True:
        got = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), WAIT_S)
        if not got:
            assert proc.stderr is not None
            pytest.fail(f"migrator ended before {wanted!r} ({proc.wait()}): {proc.stderr.read()}")
        if got.strip() == wanted:
            return


async def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = await asyncio.to_thread(proc.communicate, None, WAIT_S)
    return proc.returncode, out, err


def created_by(out: str) -> int:
    done = [ln for ln in out.splitlines() if ln.startswith("done ")]
    assert done, out
    return int(done[-1].split()[1])


async def waiters(engine: AsyncEngine, kind: str, pattern: str) -> int:
    """Statements like ``pattern`` that wait for a lock right now (never our own)."""
    async with engine.connect() as conn:
        if kind == "postgres":
            query = text(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE NOT l.granted AND a.pid <> pg_backend_pid() AND a.query LIKE :p"
            )
        else:
            # (MariaDB's information_schema.innodb_trx may not list a transaction blocked
            # on its first locking read; the processlist shows the statement running.)
            query = text(
                "SELECT COUNT(*) FROM information_schema.processlist WHERE command = 'Query' "
                "AND id <> CONNECTION_ID() AND info LIKE :p"
            )
        return int((await conn.execute(query, {"p": pattern})).scalar_one())


async def seen_waiting(
    engine: AsyncEngine, kind: str, pattern: str, proc: subprocess.Popen[str]
) -> None:
    """Return once a statement like ``pattern`` is seen waiting; fail if ``proc`` ends first."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while await waiters(engine, kind, pattern) < 1:
        if proc.poll() is not None:
            _, out, err = await finish(proc)
            pytest.fail(f"the waiter ended instead of waiting: {out} {err}")
        if loop.time() > deadline:
            pytest.fail(f"no statement like {pattern!r} was seen waiting in {WAIT_S} s")
        await asyncio.sleep(0.05)


async def version_rows(engine: AsyncEngine, names: TableNames) -> int:
    version = names.version_table
    async with engine.connect() as conn:
        table = await conn.run_sync(lambda c: Table(version, MetaData(), autoload_with=c))
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())


async def has_table(engine: AsyncEngine, name: str) -> bool:
    async with engine.connect() as conn:
        return await conn.run_sync(lambda c: inspect(c).has_table(name))


async def hold_then_queue(
    file_backend: Any, engine: AsyncEngine, names: TableNames
) -> tuple[subprocess.Popen[str], subprocess.Popen[str]]:
    """Migrator A holding the row (paused), migrator B proven waiting for it."""
    a = start(file_backend.url, names, "row", pause=True)
    try:
        await until(a, "holding")
        b = start(file_backend.url, names, "row", pause=False)
        if file_backend.kind == "sqlite":
            # The file's write lock: B says it reached BEGIN IMMEDIATE while A holds it.
            await until(b, "reached")
        else:
            pattern = f"%{names.migration_lock_table}%FOR UPDATE%"
            await seen_waiting(engine, file_backend.kind, pattern, b)
    except BaseException:
        a.kill()
        a.wait()
        raise
    return a, b


@pytest.fixture(autouse=True)
def _fresh_probes() -> Iterator[None]:
    _lock.forget_probes()
    yield
    _lock.forget_probes()


async def test_two_migrators_queue_on_the_row_and_migrate_once(
    file_backend: Any, engine: AsyncEngine, names: TableNames
) -> None:
    """B waits on A's row; once A commits, B finds head and applies nothing; both succeed."""
    a, b = await hold_then_queue(file_backend, engine, names)
    try:
        if file_backend.kind == "sqlite":
            # Still queued behind A: had B got the file's lock it would have said so.
            assert b.poll() is None
        assert a.stdin is not None
        a.stdin.write("\n")
        a.stdin.flush()
        code_a, out_a, err_a = await finish(a)
        code_b, out_b, err_b = await finish(b)
    finally:
        for p in (a, b):
            if p.poll() is None:
                p.kill()
                p.wait()
    assert (code_a, code_b) == (0, 0), (err_a, err_b)
    assert created_by(out_a) > 0  # A made the tables ...
    assert out_b.splitlines()[-2:] == ["holding", "done 0"]  # ... B got the row after, made none
    assert await migrations.current(engine, **kw(names)) == migrations.head()
    assert await version_rows(engine, names) == 1
    assert await migrations.check(engine, **kw(names)) == []


async def test_a_killed_holder_releases_the_row(
    file_backend: Any, engine: AsyncEngine, names: TableNames
) -> None:
    """SIGKILL the holder while B waits: the server (or the OS) frees the row, B migrates."""
    a, b = await hold_then_queue(file_backend, engine, names)
    try:
        a.kill()  # SIGKILL
        a.wait()
        code_b, out_b, err_b = await finish(b)
    finally:
        if b.poll() is None:
            b.kill()
            b.wait()
    assert code_b == 0, err_b
    assert created_by(out_b) > 0  # A had applied nothing; B applied it all
    assert await migrations.current(engine, **kw(names)) == migrations.head()
    assert await version_rows(engine, names) == 1


async def test_auto_probe_picks_advisory_where_it_excludes(
    backend: Any, engine: AsyncEngine, names: TableNames
) -> None:
    """Postgres, MariaDB and PgBouncer (transaction mode) all exclude: auto takes advisory.

    Behind PgBouncer in transaction mode each transaction gets its own server
    connection, and ours is a transaction-scoped advisory lock
    (``pg_advisory_xact_lock``), so the probe's second transaction is refused:
    advisory locks work there, and auto keeps them. (A session-level
    ``pg_advisory_lock`` would not survive transaction pooling; we never take one.)
    SQLite has no advisory locks to lack: its lock is the file's (``BEGIN IMMEDIATE``).
    """
    async with engine.connect() as conn:
        chosen = await conn.run_sync(lambda c: _lock.choose(c, "auto"))
    assert chosen == "advisory"
    await migrations.upgrade(engine, lock="auto", **kw(names))
    assert not await has_table(engine, names.migration_lock_table)


@pytest.mark.direct_postgres("a search_path startup parameter (PgBouncer refuses it)")
async def test_auto_probe_picks_rows_when_advisory_locks_are_stubs(
    backend: Any, names: TableNames
) -> None:
    """A server whose advisory lock functions grant everyone (CockroachDB-style stubs) gets rows.

    The stubs are real SQL functions of a schema searched before ``pg_catalog``.
    """
    if backend.kind != "postgres":
        pytest.skip("the stub functions are Postgres functions")
    schema = f"stub_{uuid.uuid4().hex[:8]}"
    plain = create_engine(backend.url)
    stubbed = create_engine(
        backend.url,
        connect_args={"server_settings": {"search_path": f"public, {schema}, pg_catalog"}},
    )
    try:
        async with plain.begin() as conn:
            await conn.execute(text(f'CREATE SCHEMA "{schema}"'))
            await conn.execute(
                text(
                    f'CREATE FUNCTION "{schema}".pg_try_advisory_xact_lock(bigint) '
                    "RETURNS boolean LANGUAGE sql AS 'SELECT true'"
                )
            )
            await conn.execute(
                text(
                    f'CREATE FUNCTION "{schema}".pg_advisory_xact_lock(bigint) '
                    "RETURNS void LANGUAGE sql AS 'SELECT'"
                )
            )
        async with stubbed.connect() as conn:
            chosen = await conn.run_sync(lambda c: _lock.choose(c, "auto"))
        assert chosen == "row"
        await migrations.upgrade(stubbed, lock="auto", **kw(names))
        assert await has_table(plain, names.migration_lock_table)
        assert await migrations.current(plain, **kw(names)) == migrations.head()
    finally:
        await stubbed.dispose()
        async with plain.begin() as conn:
            await conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        await plain.dispose()


async def test_lock_choice_is_validated_before_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad ``lock=`` (or environment value) is a ValueError naming the choices; no file made."""
    db = tmp_path / "never.db"
    url = f"sqlite:///{db}"
    with pytest.raises(ValueError, match=r"invalid migration lock 'rows' \(from lock\)") as e:
        await migrations.upgrade(url, lock="rows")
    assert "auto, advisory, row" in str(e.value)
    monkeypatch.setenv(_lock.LOCK_ENV, "mutex")
    with pytest.raises(ValueError, match=r"'mutex' \(from \$AGENTS_MEMORY_MIGRATION_LOCK\)"):
        await migrations.upgrade(url)
    with pytest.raises(ValueError, match="invalid migration lock"):
        await migrations.downgrade(url, revision="base")
    with pytest.raises(TypeError, match="lock must be a str"):
        await migrations.upgrade(url, lock=1)  # type: ignore[arg-type]
    assert not db.exists()
    monkeypatch.setenv(_lock.LOCK_ENV, "row")
    await migrations.upgrade(url)  # the environment's choice, taken
    sync = create_engine(f"sqlite+aiosqlite:///{db}")
    try:
        assert await has_table(sync, TableNames().migration_lock_table)
    finally:
        await sync.dispose()


async def test_row_lock_upgrade_downgrade_base_removes_the_lock_table(
    backend: Any, engine: AsyncEngine, names: TableNames
) -> None:
    """``lock="row"`` makes the table with its one row; a downgrade to base drops it."""
    await migrations.upgrade(engine, lock="row", **kw(names))
    await migrations.upgrade(engine, lock="row", **kw(names))  # again: nothing to do
    table = migration_lock_table(names)
    async with engine.connect() as conn:
        rows = (await conn.execute(select(table.c.id))).scalars().all()
    assert rows == [_lock.ROW_ID]
    assert await migrations.check(engine, **kw(names)) == []  # not part of the compared schema
    await migrations.downgrade(engine, revision="0001", lock="row", **kw(names))
    assert await has_table(engine, names.migration_lock_table)  # (the lineage still exists)
    await migrations.downgrade(engine, revision="base", lock="row", **kw(names))
    assert not await has_table(engine, names.migration_lock_table)
    assert not await has_table(engine, names.sessions)


async def test_a_losing_creator_of_the_lock_table_is_tolerated(
    file_backend: Any, engine: AsyncEngine, names: TableNames
) -> None:
    """Two creators race; the loser's error is rolled back and it carries on.

    Postgres: our uncommitted ``CREATE TABLE`` makes the migrator's ``CREATE
    TABLE IF NOT EXISTS`` wait in the catalog (seen in pg_locks), then fail on
    pg_type's unique index once we commit. MariaDB: our uncommitted insert of the
    row makes the migrator's guarded insert wait (seen in the processlist).
    SQLite: one writer holds the file, so there is no race to lose.
    """
    if file_backend.kind == "sqlite":
        pytest.skip("SQLite makes the table under the file's write lock: no race")
    table = migration_lock_table(names)
    create, _ = _lock.create_statements(table)
    racer = create_engine(file_backend.url)
    try:
        async with racer.connect() as conn:
            if file_backend.kind == "postgres":
                await conn.execute(create)
                pattern = f"%CREATE TABLE IF NOT EXISTS {table.name}%"
            else:
                await conn.execute(create)
                await conn.commit()
                await conn.execute(table.insert().values(id=_lock.ROW_ID))
                pattern = f"%INSERT INTO {table.name}%"
            b = start(file_backend.url, names, "row", pause=False)
            try:
                await seen_waiting(engine, file_backend.kind, pattern, b)
                await conn.commit()
                code, out, err = await finish(b)
            finally:
                if b.poll() is None:
                    b.kill()
                    b.wait()
    finally:
        await racer.dispose()
    assert code == 0, err
    assert created_by(out) > 0
    async with engine.connect() as conn:
        assert (await conn.execute(select(table.c.id))).scalars().all() == [_lock.ROW_ID]
    assert await migrations.current(engine, **kw(names)) == migrations.head()
