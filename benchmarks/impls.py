"""The implementations under comparison, built per target with their own tables.

Every implementation gets fresh, uniquely named tables (and on SQLite its own file), so
runs never collide with each other or with anyone else's tables on a shared server; the
server tables are dropped when the run ends. Connection pools are the same size for
everyone on Postgres, PgBouncer and MySQL (``PG_POOL_SIZE``), and warmed up before
anything is timed.

An implementation that fails (raises, returns the wrong data, or exceeds the step
timeout) is marked failed with the reason and left out from then on; the others go on.
Only a failing raw baseline stops its target, since every ratio is taken against it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from agents_memory import SessionStore, TableNames, create_engine, get_models, migrations
from agents_memory._databases.base import GROUP_COMMIT_OPTION
from benchmarks.items import ItemSource
from benchmarks.raw import RawMysql, RawPostgres, RawSqlite

PG_POOL_SIZE = 10
"""Connections per implementation on a server (Postgres, PgBouncer, MySQL): 10 for everyone."""

PG_ENGINE = {"pool_size": PG_POOL_SIZE, "max_overflow": 0, "pool_use_lifo": True}
"""Both SQLAlchemy engines (ours, the SDK's) alike: asyncpg's own pool also reuses LIFO."""

PGBOUNCER_CONNECT_ARGS: dict[str, Any] = {
    "statement_cache_size": 0,
    "prepared_statement_cache_size": 0,
    "prepared_statement_name_func": lambda: f"__asyncpg_{uuid.uuid4().hex}__",
}
"""SQLAlchemy's documented asyncpg settings behind PgBouncer, for the SDK's engine and DDL.

No statement caches, and a unique name for each statement SQLAlchemy prepares (it always
prepares, by name): the name cannot collide with one another client left on the server
connection, and the statement runs inside the transaction that prepared it. Not given
to ours, which gets only the URL, as a user would pass it.
"""


T = TypeVar("T")


class StepTimeoutError(TimeoutError):
    """A step (setup, warm-up, round, check, close) took longer than the step timeout."""


async def bounded(step: Awaitable[T], seconds: float, what: str) -> T:
    """Await ``step``, failing it after ``seconds`` (the run never hangs on a stuck store)."""
    try:
        return await asyncio.wait_for(step, seconds)
    except TimeoutError as exc:
        msg = f"{what} did not finish within {seconds:g} s"
        raise StepTimeoutError(msg) from exc


def describe(exc: BaseException) -> str:
    """One line for a failure: the error, and its root cause when there is one."""

    def line(e: BaseException) -> str:
        text = str(e).strip().splitlines()
        first = text[0] if text else ""
        if len(first) > 240:
            first = first[:240] + "..."
        return f"{type(e).__module__}.{type(e).__qualname__}: {first}"

    if isinstance(exc, StepTimeoutError):
        return line(exc)  # its cause is only the cancellation
    root = exc
    seen = {id(exc)}
    while (nxt := root.__cause__ or root.__context__) is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        root = nxt
    if root is exc:
        return line(exc)
    return f"{line(exc)} (caused by {line(root)})"


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
    opened: Callable[[], int] | None = None
    """Connections opened so far (engine connects, raw pool connects), where countable."""
    failure: str | None = None
    """Why this implementation was dropped from the run, if it was."""
    failed_in: str = ""
    """Where it failed: ``setup``, ``warm-up``, or a workload's repeat and step."""


def _failed(key: str, label: str, failed_in: str, reason: str) -> Impl:
    """A placeholder for an implementation that could not be built or warmed up."""

    def no_session(_session_id: str) -> Any:
        raise RuntimeError(reason)

    async def no_close() -> None:
        return None

    return Impl(key, label, no_session, no_close, failure=reason, failed_in=failed_in)


def _count_connects(engine: AsyncEngine) -> Callable[[], int]:
    """Count the DBAPI connections ``engine`` opens (overflow churn shows here).

    By wrapping this engine's dialect's ``connect`` (what its pool calls for a new
    connection) rather than listening for the pool's ``connect`` event: a store may
    take a listener as a reason to run differently (ours runs statements through
    SQLAlchemy when someone else observes them), and the count must not change what
    it counts. Connections a store opens without its engine are not seen.
    """
    count = [0]
    dialect: Any = engine.sync_engine.dialect
    connect = dialect.connect

    def counting_connect(*args: Any, **kwargs: Any) -> Any:
        count[0] += 1
        return connect(*args, **kwargs)

    dialect.connect = counting_connect
    return lambda: count[0]


@dataclasses.dataclass
class Database:
    """Where the implementations run: SQLite files in a directory, or one Postgres server."""

    key: str  # "sqlite", "postgres", "pgbouncer" or "mysql"
    title: str
    tag: str
    directory: Path | None = None
    url: str | None = None
    """The server's URL (Postgres, a PgBouncer in front of Postgres, or MySQL/MariaDB)."""
    created: list[TableNames] = dataclasses.field(default_factory=list)

    @property
    def is_postgres(self) -> bool:
        """Postgres, directly or through PgBouncer."""
        return self.key in {"postgres", "pgbouncer"}

    def sqlalchemy_connect_args(self) -> dict[str, Any]:
        """``connect_args`` for the SQLAlchemy engines we configure (the SDK's, DDL)."""
        return dict(PGBOUNCER_CONNECT_ARGS) if self.key == "pgbouncer" else {}

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
        if self.url is None or not self.created:
            return
        if self.key == "mysql":
            engine = create_engine(self.url)
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
                        for table in (*reversed(names.tables), names.version_table):
                            if table in existing:
                                await sa_conn.exec_driver_sql(f"DROP TABLE {table}")
            finally:
                await engine.dispose()
            return
        # Simple-protocol statements only (no prepared statements): safe through PgBouncer.
        conn = await asyncpg.connect(self.url, statement_cache_size=0)
        try:
            for names in self.created:
                for table in (*reversed(names.tables), names.version_table):
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


class WarmUpError(Exception):
    """Which part of the warm-up failed; the error itself is the cause."""


async def _warm_up(impl: Impl, items: ItemSource) -> None:
    """Run every operation once, and fill the pool, before anything is timed."""
    sessions = [impl.session(f"warmup-{i}") for i in range(PG_POOL_SIZE * 2)]
    n = len(sessions)
    phase = f"{n} concurrent add_items"
    try:
        await asyncio.gather(*(s.add_items(items.turn()) for s in sessions))
        phase = f"{n} concurrent get_items(limit=2)"
        await asyncio.gather(*(s.get_items(limit=2) for s in sessions))
        phase = "sequential get_items, pop_item, clear_session"
        for s in sessions:
            await s.get_items()
            await s.pop_item()
            await s.clear_session()
    except Exception as exc:
        raise WarmUpError(phase) from exc
    impl.release(sessions)


LABELS = {
    "raw": "the bare driver",
    "sdk": "Agents SDK SQLAlchemySession",
    "stdlib": "Agents SDK SQLiteSession (stdlib sqlite3)",
    "ours": "agents_memory SessionStore",
    "ours_1tx": "agents_memory SessionStore, group commit off (one transaction per batch)",
    "ours_part": "agents_memory SessionStore, messages hash-partitioned by session",
}


async def _raw(db: Database) -> Impl:
    names = db.names("raw")
    url = f"sqlite:///{db.sqlite_path('raw')}" if db.key == "sqlite" else db.url or ""
    engine = create_engine(url, connect_args=db.sqlalchemy_connect_args())
    try:
        await _create_schema(engine, names)
    finally:
        await engine.dispose()
    store: RawSqlite | RawPostgres | RawMysql
    if db.key == "sqlite":
        store, label = RawSqlite(db.sqlite_path("raw"), names), "aiosqlite"
    elif db.key == "mysql":
        store, label = RawMysql(url, names, PG_POOL_SIZE), "asyncmy"
    elif db.key == "pgbouncer":
        store = RawPostgres(url, names, PG_POOL_SIZE, statement_cache_size=0)
        label = "asyncpg, statement_cache_size=0"
    else:
        store, label = RawPostgres(url, names, PG_POOL_SIZE), "asyncpg"
    await store.open()
    return Impl("raw", label, store.session, store.close, opened=lambda: store.opened)


async def _ours(db: Database, *, key: str = "ours", partitions: int | None = None) -> Impl:
    names = db.names(key)
    if db.key == "sqlite":
        # Group commit is on by default; "ours_1tx" turns it off (engine execution option).
        options = {"execution_options": {GROUP_COMMIT_OPTION: False}} if key == "ours_1tx" else {}
        engine = create_engine(f"sqlite:///{db.sqlite_path(key)}", **options)
    else:
        engine = create_engine(db.url or "", **PG_ENGINE)
    opened = _count_connects(engine)
    try:
        # Migrated first, so ``partitions`` (else $AGENTS_MEMORY_PARTITIONS) picks the layout.
        kw = {"sessions_table": names.sessions, "messages_table": names.messages}
        await migrations.upgrade(engine, partitions=partitions, **kw)
        store = SessionStore(engine, **kw)
    except BaseException:
        await engine.dispose()
        raise

    async def close() -> None:
        try:
            await store.close()
        finally:
            await engine.dispose()

    return Impl(key, LABELS[key], store.session, close, opened=opened)


def _ours_partitioned(partitions: int) -> Callable[[Database], Awaitable[Impl]]:
    """Ours with the messages table hash-partitioned (Postgres): the layout's own cost."""

    async def make(db: Database) -> Impl:
        return await _ours(db, key="ours_part", partitions=partitions)

    return make


async def _ours_1tx(db: Database) -> Impl:
    """Ours on SQLite with group commit off: what grouping itself is worth."""
    return await _ours(db, key="ours_1tx")


async def _sdk(db: Database) -> Impl:
    from agents.extensions.memory import SQLAlchemySession  # noqa: PLC0415

    names = db.names("sdk")
    label = LABELS["sdk"]
    if db.key == "sqlite":
        engine = create_async_engine(
            f"sqlite+aiosqlite:///{db.sqlite_path('sdk')}", pool_use_lifo=True
        )
    else:
        url = (db.url or "").replace("postgresql://", "postgresql+asyncpg://", 1)
        engine = create_async_engine(url, connect_args=db.sqlalchemy_connect_args(), **PG_ENGINE)
        if db.key == "pgbouncer":
            label += " (no statement caches, unique statement names)"
    opened = _count_connects(engine)
    first = SQLAlchemySession(
        "schema",
        engine=engine,
        create_tables=True,
        sessions_table=names.sessions,
        messages_table=names.messages,
    )
    try:
        await first.get_items()  # creates the tables
    except BaseException:
        await engine.dispose()
        raise

    def session(session_id: str) -> Any:
        return SQLAlchemySession(
            session_id,
            engine=engine,
            sessions_table=names.sessions,
            messages_table=names.messages,
        )

    return Impl("sdk", label, session, engine.dispose, opened=opened)


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

    return Impl("stdlib", LABELS["stdlib"], session, close, release)


Builder = Callable[[Database], Awaitable[Impl]]


def _builders(
    db: Database, *, peers: bool, ungrouped: bool, partitioned: int | None
) -> list[tuple[str, Builder]]:
    """The implementations to run on ``db``, raw first."""
    builders: list[tuple[str, Builder]] = [("raw", _raw)]
    if peers and has_agents_sdk() and db.key != "mysql":  # the SDK cannot create MySQL tables
        builders.append(("sdk", _sdk))
        if db.key == "sqlite":
            builders.append(("stdlib", _stdlib))
    builders.append(("ours", _ours))
    if ungrouped and db.key == "sqlite":
        builders.append(("ours_1tx", _ours_1tx))
    if partitioned and db.is_postgres:
        builders.append(("ours_part", _ours_partitioned(partitioned)))
    return builders


async def build(
    db: Database,
    items: ItemSource,
    *,
    peers: bool,
    step_seconds: float,
    ungrouped: bool = False,
    partitioned: int | None = None,
) -> list[Impl]:
    """Raw first (the ratios' denominator), then the peers when installed, then ours.

    ``ungrouped`` adds ours with group commit off on SQLite (``ours_1tx``);
    ``partitioned`` adds ours with that many hash partitions on Postgres and
    PgBouncer (``ours_part``).

    Raw failing raises (nothing can be compared without it); any other implementation
    that fails to build or warm up comes back as a failed placeholder with the reason.
    """
    builders = _builders(db, peers=peers, ungrouped=ungrouped, partitioned=partitioned)
    impls: list[Impl] = []
    try:
        for key, make in builders:
            impl: Impl | None = None
            try:
                impl = await bounded(make(db), step_seconds, f"{key}: setup")
                await bounded(_warm_up(impl, items), step_seconds, f"{key}: warm-up")
            except Exception as exc:
                if impl is not None:
                    await close_one(impl, step_seconds)
                if key == "raw":
                    raise
                stage = "setup" if impl is None else "warm-up (untimed)"
                error: BaseException = exc
                if isinstance(exc, WarmUpError) and exc.__cause__ is not None:
                    stage, error = f"warm-up (untimed), {exc}", exc.__cause__
                impl = _failed(key, impl.label if impl else LABELS[key], stage, describe(error))
            impls.append(impl)
    except BaseException:
        await close_all(impls, step_seconds)
        raise
    return impls


async def close_one(impl: Impl, step_seconds: float) -> str | None:
    """Close ``impl`` within ``step_seconds``; what went wrong, if anything (never raises)."""
    try:
        await bounded(impl.close(), step_seconds, f"{impl.key}: close")
    except Exception as exc:
        return describe(exc)
    return None


async def close_all(impls: list[Impl], step_seconds: float) -> None:
    """Close every implementation, even if one of them fails to (each within ``step_seconds``)."""
    for impl in impls:
        problem = await close_one(impl, step_seconds)
        if problem is not None and impl.failure is None:
            print(f"  {impl.key}: closing failed: {problem}")
