"""One fixture parametrises every backend; each test gets its own tables.

Backends come from ``AGENTS_MEMORY_TEST_DB`` (comma-separated: ``sqlite``,
``postgres``, ``mysql``, ``pgbouncer``; default the first three). Postgres is reached at
``AGENTS_MEMORY_TEST_POSTGRES_URL`` (default ``postgresql://root@127.0.0.1:5432/test``),
MySQL/MariaDB at ``AGENTS_MEMORY_TEST_MYSQL_URL`` (default
``mysql://root@127.0.0.1:3306/test``), and the same Postgres through PgBouncer in
transaction pooling mode (``bash .ci/pgbouncer`` starts one) at
``AGENTS_MEMORY_TEST_PGBOUNCER_URL`` (default ``postgresql://root@127.0.0.1:6432/test``);
when a server does not answer its tests are skipped with the reason, unless ``CI`` is
set, in which case they fail: CI must never pass by skipping.

The PgBouncer backend has id ``pgbouncer`` and kind ``postgres``: every test treats it as
Postgres. A test that needs a direct server connection (session state such as a backend
pid, a session setting or a startup parameter) says so with
``@pytest.mark.direct_postgres("why")``, which skips it for ``pgbouncer`` only.

A test that does not take ``backend`` talks to no server, so it would do the same work in
every server's suite: it runs when ``sqlite`` is selected (the default, and nox's sqlite
suite) and is deselected from a selection of servers only. An audit hook keeps that honest:
such a test that connects to a configured server's port fails and names the fixture to take.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest
from sqlalchemy import MetaData, Table
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.schema import DropTable

from agents_memory import SessionStore, TableNames, create_engine

POSTGRES_URL = os.environ.get(
    "AGENTS_MEMORY_TEST_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test"
)
MYSQL_URL = os.environ.get("AGENTS_MEMORY_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
PGBOUNCER_URL = os.environ.get(
    "AGENTS_MEMORY_TEST_PGBOUNCER_URL", "postgresql://root@127.0.0.1:6432/test"
)
SELECTED = {
    name.strip()
    for name in os.environ.get("AGENTS_MEMORY_TEST_DB", "sqlite,postgres,mysql").split(",")
    if name.strip()
}
IN_CI = bool(os.environ.get("CI"))


@dataclass(frozen=True)
class Backend:
    """One database a test runs against."""

    id: str  # "sqlite-file", "sqlite-memory", "postgres", "mysql" or "pgbouncer"
    kind: str  # "sqlite", "postgres" (also through PgBouncer) or "mysql"
    url: str


_TABLES_BEFORE = pytest.StashKey[dict[str, set[str]]]()

_DEFAULT_PORTS = {"postgres": 5432, "mysql": 3306, "pgbouncer": 6432}
_HOW_TO_START = {"pgbouncer": "; start one with `bash .ci/pgbouncer`"}


def _address(kind: str, url: str) -> tuple[str, int]:
    """The host and port a server URL points at (the kind's default port when it names none)."""
    parsed = make_url(url)
    return parsed.host or "127.0.0.1", parsed.port or _DEFAULT_PORTS[kind]


def _server_answers(kind: str, url: str) -> str | None:
    """None if a TCP server answers at the URL's host and port, else why not."""
    host, port = _address(kind, url)
    try:
        with socket.create_connection((host, port), timeout=2):
            return None
    except OSError as exc:
        return f"no {kind} server answers at {host}:{port} ({exc})"


def require_server(kind: str, url: str) -> None:
    """Skip (or, under CI, fail) when the server behind ``url`` is not reachable."""
    reason = _server_answers(kind, url)
    if reason is None:
        return
    others = ",".join(sorted(SELECTED - {kind})) or "sqlite"
    message = (
        f"{reason}{_HOW_TO_START.get(kind, '')}; "
        f"set AGENTS_MEMORY_TEST_DB={others} to run without {kind}"
    )
    if IN_CI:
        pytest.fail(f"CI is set, so a missing server is a failure: {message}")
    pytest.skip(message)


def _backends() -> list[pytest.param]:  # type: ignore[valid-type]
    params = []
    if "sqlite" in SELECTED:
        params.append(pytest.param("sqlite-file", id="sqlite-file"))
        params.append(pytest.param("sqlite-memory", id="sqlite-memory"))
    if "postgres" in SELECTED:
        params.append(pytest.param("postgres", id="postgres"))
    if "mysql" in SELECTED:
        params.append(pytest.param("mysql", id="mysql"))
    if "pgbouncer" in SELECTED:
        params.append(pytest.param("pgbouncer", id="pgbouncer"))
    return params


_SERVER_URLS = {"postgres": POSTGRES_URL, "mysql": MYSQL_URL, "pgbouncer": PGBOUNCER_URL}
_SERVER_KINDS = {"postgres": "postgres", "mysql": "mysql", "pgbouncer": "postgres"}


def pytest_configure(config: pytest.Config) -> None:
    """Register the suite's own marker (``--strict-markers`` is on) and the server guard."""
    config.addinivalue_line(
        "markers",
        "direct_postgres(reason): needs a direct Postgres connection; skipped, with the reason, "
        "for the pgbouncer backend (transaction pooling keeps no session state)",
    )
    _ServerGuard.install()


# -- tests that take no database run once ---------------------------------------------------


def _takes_a_database(item: pytest.Item) -> bool:
    """Whether a test runs against a database.

    It does when it takes ``backend``, directly or through a fixture that does: then the
    selected databases parametrise it.
    """
    return "backend" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without ``sqlite`` selected, deselect the tests that take no database.

    They reach no server (the guard below fails one that does), so in a server's own suite
    they would only repeat what the sqlite suite (or the default selection) already ran.
    """
    if "sqlite" in SELECTED:
        return
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        (kept if _takes_a_database(item) else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


class _ServerGuard:
    """Fails a test that takes no ``backend`` yet connects to a configured server's port.

    Such a test would be deselected from that server's suite and skipped by nobody when the
    server is down, so its database work would go untested or break a machine without one.
    An audit hook (``socket.connect``) sees every connection the test process makes, from
    any driver or thread, to a server's port on any host; it only records, and the test's
    setup, call or teardown fails afterwards, so no driver sees a strange exception. Audit
    hooks cannot be removed: one is installed per process and is switched on only while
    such a test runs.
    """

    installed: ClassVar[bool] = False
    watching: ClassVar[bool] = False
    ports: ClassVar[dict[int, str]] = {}
    seen: ClassVar[list[str]] = []

    @classmethod
    def install(cls) -> None:
        if cls.installed:
            return
        cls.ports = {_address(kind, url)[1]: kind for kind, url in _SERVER_URLS.items()}
        sys.addaudithook(cls._audit)
        cls.installed = True

    @classmethod
    def _audit(cls, event: str, args: tuple[object, ...]) -> None:
        if not cls.watching or event != "socket.connect":
            return
        address = args[1]
        if isinstance(address, tuple) and len(address) >= 2 and address[1] in cls.ports:
            cls.seen.append(f"{address[0]}:{address[1]} ({cls.ports[address[1]]})")

    @classmethod
    def watch(cls, item: pytest.Item) -> Generator[None, object, object]:
        """Wrap one phase of a test; fail it if it connected to a server without ``backend``."""
        if _takes_a_database(item):
            return (yield)
        cls.seen.clear()
        cls.watching = True
        try:
            result = yield
        finally:
            cls.watching = False
        if cls.seen:
            pytest.fail(
                f"{item.nodeid} takes no `backend` fixture but connected to "
                f"{', '.join(sorted(set(cls.seen)))}: take `backend` (or a fixture built on "
                "it) so the test runs once per selected database and is skipped, with the "
                "reason, where the server is down",
                pytrace=False,
            )
        return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    """Setup of a database-free test (its fixtures) reaches no server either."""
    return (yield from _ServerGuard.watch(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    """The body of a database-free test reaches no server."""
    return (yield from _ServerGuard.watch(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, object, object]:
    """Nor does its fixtures' teardown."""
    return (yield from _ServerGuard.watch(item))


@pytest.fixture(params=_backends())
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """The database under test: every test using it runs once per selected backend."""
    kind_id: str = request.param
    if kind_id == "sqlite-file":
        return Backend(kind_id, "sqlite", f"sqlite+aiosqlite:///{tmp_path / 'store.db'}")
    if kind_id == "sqlite-memory":
        return Backend(kind_id, "sqlite", "sqlite+aiosqlite://")
    direct = request.node.get_closest_marker("direct_postgres")
    if kind_id == "pgbouncer" and direct is not None:
        why = direct.args[0] if direct.args else "it needs a direct Postgres connection"
        pytest.skip(f"not through PgBouncer (transaction pooling): {why}")
    url = _SERVER_URLS[kind_id]
    require_server(kind_id, url)
    return Backend(kind_id, _SERVER_KINDS[kind_id], url)


@pytest.fixture
def file_backend(backend: Backend) -> Backend:
    """Like ``backend``, but only databases that outlive one engine (not in-memory SQLite)."""
    if backend.id == "sqlite-memory":
        pytest.skip("needs a database shared between engines or processes")
    return backend


@pytest.fixture
def names() -> TableNames:
    """A fresh table-name pair, so tests (and parallel runs) never share tables."""
    tag = uuid.uuid4().hex[:10]
    return TableNames(f"t{tag}_sessions", f"t{tag}_messages")


async def drop_tables(engine: AsyncEngine, names: TableNames) -> None:
    """Remove a test's tables (and its version table) from a shared server.

    SQLAlchemy quotes each name as the dialect needs (mixed case, reserved words).
    """
    async with engine.begin() as conn:
        for table in (*reversed(names.tables), names.version_table, names.migration_lock_table):
            await conn.execute(DropTable(Table(table, MetaData()), if_exists=True))


@pytest.fixture
def drop_set() -> Callable[[AsyncEngine, TableNames], Awaitable[None]]:
    """:func:`drop_tables`, for a test that makes table names of its own.

    A fixture, not an import: ``from conftest import …`` finds whichever
    ``conftest`` module was imported first (``tests/cli`` and ``tests/reliability``
    have their own).
    """
    return drop_tables


@pytest.fixture
async def engine(backend: Backend, names: TableNames) -> AsyncIterator[AsyncEngine]:
    """An engine on the backend; tables it gets are dropped afterwards."""
    eng = create_engine(backend.url)
    try:
        yield eng
    finally:
        if backend.kind != "sqlite":
            await drop_tables(eng, names)
        await eng.dispose()


@pytest.fixture(autouse=True)
async def _drop_server_tables(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Tests on a server that use ``names`` but not ``engine`` leave no tables behind either."""
    used = set(request.fixturenames)
    if "names" not in used or "engine" in used or not _takes_a_database(request.node):
        yield
        return
    backend: Backend = request.getfixturevalue("backend")
    names: TableNames = request.getfixturevalue("names")
    yield
    if backend.kind != "sqlite":
        eng = create_engine(backend.url)
        try:
            await drop_tables(eng, names)
        finally:
            await eng.dispose()


@pytest.fixture
async def store(engine: AsyncEngine, names: TableNames) -> AsyncIterator[SessionStore]:
    """A store with its schema created on the backend under test."""
    s = SessionStore(
        engine, sessions_table=names.sessions, messages_table=names.messages, create_tables=True
    )
    yield s
    await s.close()


def pytest_report_header() -> list[str]:
    """Say which copy of the package is under test and which databases are selected."""
    import agents_memory  # noqa: PLC0415

    return [
        f"agents_memory {agents_memory.__version__} from {Path(agents_memory.__file__).parent}",
        f"databases: {', '.join(sorted(SELECTED))} (AGENTS_MEMORY_TEST_DB); CI={IN_CI}",
        "Postgres layout: "
        + (
            f"messages hash-partitioned into {os.environ['AGENTS_MEMORY_PARTITIONS']}"
            if os.environ.get("AGENTS_MEMORY_PARTITIONS", "0").strip() not in ("", "0")
            else "plain"
        )
        + " (AGENTS_MEMORY_PARTITIONS)",
    ]


# -- the suite leaves no table behind -------------------------------------------------------

_DIRECT_SERVERS = {"postgres": POSTGRES_URL, "mysql": MYSQL_URL}
"""Where tables live (PgBouncer's tables are Postgres'): one listing per server."""


def _server_tables() -> dict[str, set[str]]:
    """Every table in each selected server's database, by server ("" when it does not answer)."""
    from sqlalchemy import inspect  # noqa: PLC0415

    wanted = {
        kind: url
        for kind, url in _DIRECT_SERVERS.items()
        if (kind in SELECTED or (kind == "postgres" and "pgbouncer" in SELECTED))
        and _server_answers(kind, url) is None
    }

    async def listing(url: str) -> set[str]:
        eng = create_engine(url)
        try:
            async with eng.connect() as conn:
                return set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
        finally:
            await eng.dispose()

    async def all_of_them() -> dict[str, set[str]]:
        return {kind: await listing(url) for kind, url in wanted.items()}

    return asyncio.run(all_of_them())


def _spans_the_run(session: pytest.Session) -> bool:
    """Whether this session starts before the run's first test and ends after its last.

    A serial run's does, and so does pytest-xdist's controller (nox runs the suite with
    ``-n auto``); a worker's session ends while the others may still hold a test's tables.
    xdist gives each worker's config a ``workerinput``.
    """
    return not hasattr(session.config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Note the servers' tables before the first test.

    (Before xdist's controller starts its workers: that hook of xdist runs last.)
    """
    if _spans_the_run(session):
        session.config.stash[_TABLES_BEFORE] = _server_tables()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Tables the run created and left behind fail the run under CI (else are reported).

    Outside CI another run may share the servers and own what appeared meanwhile,
    so there it is a warning; CI runs alone. (An xdist worker noted nothing at its start,
    so it looks at nothing here.)
    """
    before = session.config.stash.get(_TABLES_BEFORE, None)
    if before is None or exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
        return
    after = _server_tables()
    left = {kind: sorted(after.get(kind, set()) - tables) for kind, tables in before.items()}
    left = {kind: tables for kind, tables in left.items() if tables}
    if not left:
        return
    text = "; ".join(f"{kind}: {', '.join(tables)}" for kind, tables in left.items())
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"tables left behind by this run: {text}", red=IN_CI, yellow=not IN_CI)
    if IN_CI:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
