"""The implementations under comparison, built per database with their own tables.

Every implementation gets fresh, uniquely named tables (and on SQLite its own file), so
runs never collide with each other or with anyone else's tables on a shared server; the
Postgres tables are dropped when the run ends. Connection pools are the same size for
everyone on Postgres, and warmed up before anything is timed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from agents_memory import SessionStore, TableNames, create_engine, get_models
from benchmarks.items import ItemSource
from benchmarks.raw import RawMysql, RawPostgres, RawSqlite

PG_POOL_SIZE = 10
"""Connections per implementation on Postgres: a fixed pool of 10 for everyone."""

PG_ENGINE = {"pool_size": PG_POOL_SIZE, "max_overflow": 0, "pool_use_lifo": True}
"""Both SQLAlchemy engines (ours, the SDK's) alike: asyncpg's own pool also reuses LIFO."""


@dataclasses.dataclass
class Impl:
    """One implementation on one database, as the workloads see it."""

    key: str
    """Short column name: raw, sdk, stdlib, ours."""
    label: str
    session: Callable[[str], Any]
    """Make a session object (done before timing starts)."""
    close: Callable[[], Awaitable[None]]
    release: Callable[[list[Any]], None] = lambda _sessions: None
    """Free per-session resources after a workload (the stdlib class holds connections)."""
    state: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Sessions prefilled once and reused by the read workloads."""


@dataclasses.dataclass
class Database:
    """Where the implementations run: SQLite files in a directory, or one Postgres server."""

    key: str  # "sqlite", "postgres" or "mysql"
    title: str
    tag: str
    directory: Path | None = None
    postgres_url: str | None = None
    """The server's URL (Postgres or MySQL/MariaDB; the name predates MySQL)."""
    created: list[TableNames] = dataclasses.field(default_factory=list)

    def names(self, impl: str) -> TableNames:
        """Fresh table names for ``impl``, remembered so they can be dropped."""
        names = TableNames(f"bench_{self.tag}_{impl}_sessions", f"bench_{self.tag}_{impl}_messages")
        self.created.append(names)
        return names

    def sqlite_path(self, impl: str) -> str:
        """The SQLite file of ``impl``."""
        if self.directory is None:
            msg = "SQLite database without a directory"
            raise RuntimeError(msg)
        return str(self.directory / f"{impl}.db")

    async def drop_tables(self) -> None:
        """Drop every table this run created on the server (nothing else)."""
        if self.postgres_url is None or not self.created:
            return
        if self.key == "mysql":
            engine = create_engine(self.postgres_url)
            try:
                async with engine.begin() as sa_conn:
                    # Only those that exist: MariaDB reports each missing one as a warning.
                    existing = set(
                        (
                            await sa_conn.exec_driver_sql(
                                "SELECT table_name FROM information_schema.tables "
                                "WHERE table_schema = DATABASE()"
                            )
                        ).scalars()
                    )
                    for names in self.created:
                        for table in (names.messages, names.sessions, names.version_table):
                            if table in existing:
                                await sa_conn.exec_driver_sql(f"DROP TABLE {table}")
            finally:
                await engine.dispose()
            return
        conn = await asyncpg.connect(self.postgres_url)
        try:
            for names in self.created:
                for table in (names.messages, names.sessions, names.version_table):
                    await conn.execute(f"DROP TABLE IF EXISTS {table}")
        finally:
            await conn.close()


def has_agents_sdk() -> bool:
    """Whether the OpenAI Agents SDK (the peers) is installed."""
    return importlib.util.find_spec("agents") is not None


async def _create_schema(engine: AsyncEngine, names: TableNames) -> None:
    """Our schema, for the raw baseline too, so both run on identical tables and indexes."""
    async with engine.begin() as conn:
        await conn.run_sync(get_models(names).metadata.create_all)


async def _warm_up(impl: Impl, items: ItemSource) -> None:
    """Run every operation once, and fill the pool, before anything is timed."""
    sessions = [impl.session(f"warmup-{i}") for i in range(PG_POOL_SIZE * 2)]
    await asyncio.gather(*(s.add_items(items.turn()) for s in sessions))
    await asyncio.gather(*(s.get_items(limit=2) for s in sessions))
    for s in sessions:
        await s.get_items()
        await s.pop_item()
        await s.clear_session()
    impl.release(sessions)


async def _raw(db: Database) -> Impl:
    names = db.names("raw")
    url = f"sqlite:///{db.sqlite_path('raw')}" if db.key == "sqlite" else db.postgres_url or ""
    engine = create_engine(url)
    await _create_schema(engine, names)
    await engine.dispose()
    store: RawSqlite | RawPostgres | RawMysql
    if db.key == "sqlite":
        store, label = RawSqlite(db.sqlite_path("raw"), names), "aiosqlite"
    elif db.key == "mysql":
        store, label = RawMysql(url, names, PG_POOL_SIZE), "asyncmy"
    else:
        store, label = RawPostgres(url, names, PG_POOL_SIZE), "asyncpg"
    await store.open()
    return Impl("raw", label, store.session, store.close)


async def _ours(db: Database) -> Impl:
    names = db.names("ours")
    if db.key == "sqlite":
        engine = create_engine(f"sqlite:///{db.sqlite_path('ours')}")
    else:
        engine = create_engine(db.postgres_url or "", **PG_ENGINE)
    store = SessionStore(
        engine, sessions_table=names.sessions, messages_table=names.messages, create_tables=True
    )

    async def close() -> None:
        await store.close()
        await engine.dispose()

    return Impl("ours", "agents_memory SessionStore", store.session, close)


async def _sdk(db: Database) -> Impl:
    from agents.extensions.memory import SQLAlchemySession  # noqa: PLC0415

    names = db.names("sdk")
    if db.key == "sqlite":
        engine = create_async_engine(
            f"sqlite+aiosqlite:///{db.sqlite_path('sdk')}", pool_use_lifo=True
        )
    else:
        url = (db.postgres_url or "").replace("postgresql://", "postgresql+asyncpg://", 1)
        engine = create_async_engine(url, **PG_ENGINE)
    first = SQLAlchemySession(
        "schema",
        engine=engine,
        create_tables=True,
        sessions_table=names.sessions,
        messages_table=names.messages,
    )
    await first.get_items()  # creates the tables

    def session(session_id: str) -> Any:
        return SQLAlchemySession(
            session_id,
            engine=engine,
            sessions_table=names.sessions,
            messages_table=names.messages,
        )

    return Impl("sdk", "Agents SDK SQLAlchemySession", session, engine.dispose)


async def _stdlib(db: Database) -> Impl:
    from agents import SQLiteSession  # noqa: PLC0415

    names = db.names("stdlib")
    path = db.sqlite_path("stdlib")

    def session(session_id: str) -> Any:
        return SQLiteSession(
            session_id,
            db_path=path,
            sessions_table=names.sessions,
            messages_table=names.messages,
        )

    def release(sessions: list[Any]) -> None:
        for s in sessions:
            s.close()

    async def close() -> None:
        return None

    return Impl("stdlib", "Agents SDK SQLiteSession (stdlib sqlite3)", session, close, release)


async def build(db: Database, items: ItemSource, *, peers: bool) -> list[Impl]:
    """Raw first (the ratios' denominator), then the peers when installed, then ours."""
    builders: list[Callable[[Database], Awaitable[Impl]]] = [_raw]
    if peers and has_agents_sdk() and db.key != "mysql":  # the SDK cannot create MySQL tables
        builders.append(_sdk)
        if db.key == "sqlite":
            builders.append(_stdlib)
    builders.append(_ours)
    impls: list[Impl] = []
    try:
        for make in builders:
            impl = await make(db)
            impls.append(impl)
            await _warm_up(impl, items)
    except BaseException:
        await close_all(impls)
        raise
    return impls


async def close_all(impls: list[Impl]) -> None:
    """Close every implementation, even if one of them fails to."""
    for impl in impls:
        with contextlib.suppress(Exception):
            await impl.close()
