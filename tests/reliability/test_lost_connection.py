"""Lost connections: backends terminated mid-run, and a server that is not there at all.

Our engine tags its connections with a unique ``application_name`` so that
``pg_terminate_backend`` hits only this test's pool on the shared server.
"""

from __future__ import annotations

import asyncio
import random
import socket
import traceback
import uuid
from typing import Any

import pytest
from _support import Ledger, batch_check, make_batch, open_store, scaled
from sqlalchemy import text
from sqlalchemy.engine import make_url

from agents_memory import DatabaseConnectionError, SessionStore, TableNames, create_engine

pytestmark = pytest.mark.reliability

PASSWORD = "s3cret-Pw-7"  # noqa: S105 - trust auth ignores it; it must never appear in a message


# Through PgBouncer in transaction pooling mode a server connection serves many clients in
# turn and keeps the last client's application_name, so that name no longer identifies this
# store's backends: the admin's own query runs on (and terminates) one of them.
THROUGH_BOUNCER = pytest.mark.direct_postgres(
    "application_name does not identify a client's server connections behind a transaction "
    "pooler (a server connection keeps the last client's name), so pg_terminate_backend by "
    "name also kills other clients' connections, the admin's own included"
)


@pytest.fixture
def server(backend: Any) -> Any:
    """Backends that are a server we can terminate connections on (Postgres)."""
    if backend.kind != "postgres":
        pytest.skip("terminating backends needs a Postgres server")
    return backend


def with_password(url: str) -> str:
    return make_url(url).set(password=PASSWORD).render_as_string(hide_password=False)


async def terminate(admin: Any, app: str) -> int:
    """Terminate every backend of ``app`` and wait until they are gone; return how many."""
    async with admin.connect() as conn:
        return len(
            (
                await conn.execute(
                    text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = :a"
                    ),
                    {"a": app},
                )
            ).all()
        )


async def wait_gone(admin: Any, app: str) -> None:
    for _ in range(500):
        async with admin.connect() as conn:
            left = (
                await conn.execute(
                    text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :a"),
                    {"a": app},
                )
            ).scalar()
        if not left:
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"backends of {app} did not go away")


def check_message(exc: BaseException) -> None:
    """A clear error: typed, names the host, never shows the password (not even in the chain)."""
    assert isinstance(exc, DatabaseConnectionError), repr(exc)
    assert "127.0.0.1" in str(exc)
    rendered = "".join(traceback.format_exception(exc))
    assert PASSWORD not in rendered


@pytest.fixture
async def tagged(server: Any, names: TableNames) -> Any:
    """(store, admin engine, application_name): a store whose connections we can find and kill."""
    app = f"am_rel_{uuid.uuid4().hex[:8]}"
    store = open_store(
        with_password(server.url),
        names,
        create_tables=True,
        engine_kwargs={"connect_args": {"server_settings": {"application_name": app}}},
    )
    admin = create_engine(server.url)
    yield store, admin, app
    async with admin.begin() as conn:
        for table in (*reversed(names.tables), names.version_table):
            await conn.execute(text(f"DROP TABLE IF EXISTS {table}"))
    await store.close()
    await admin.dispose()


@THROUGH_BOUNCER
async def test_next_operation_after_terminated_pool_succeeds(tagged: Any, ledger: Ledger) -> None:
    """After every pooled backend is terminated, add/get/pop/clear each succeed straight away."""
    store, admin, app = tagged
    rounds = scaled(10, minimum=4)
    s = store.session("idle")
    expected: list[dict[str, Any]] = []
    failures = killed = 0
    for r in range(rounds):
        await asyncio.gather(*(store.session(f"warm{i}").get_items() for i in range(5)))
        killed += await terminate(admin, app)
        await wait_gone(admin, app)
        try:
            match r % 4:
                case 0 | 1:
                    await s.add_items([{"r": r}])
                    expected.append({"r": r})
                case 2:
                    assert await s.pop_item() == expected.pop()
                case _:
                    assert await s.get_items() == expected
        except DatabaseConnectionError:
            failures += 1
    ledger.add(
        "Lost connection",
        "terminate every pooled backend (pg_terminate_backend), then the next operation",
        times=rounds,
        lost=failures,
        unit="rounds",
        note=f"{killed} backends terminated; 'lost' counts next operations that failed",
    )
    assert failures == 0
    assert await s.get_items() == expected


@THROUGH_BOUNCER
async def test_backends_terminated_mid_run(tagged: Any, ledger: Ledger) -> None:  # noqa: C901, PLR0915 - one scenario; its tasks read best side by side
    """Writers and readers while backends keep being terminated: clear errors, no torn batch."""
    store, admin, app = tagged
    duration = 2.0 * max(1.0, scaled(10) / 10)
    stop = asyncio.Event()
    acked: set[Any] = set()
    uncertain: set[Any] = set()
    errors: list[BaseException] = []
    torn_reads = reads = 0

    async def writer(w: int) -> None:
        s = store.session("run")
        b = 0
        while not stop.is_set():
            try:
                await s.add_items(make_batch(w, b, 1 + (w * 5 + b) % 30))
                acked.add((w, b))
            except DatabaseConnectionError as exc:
                errors.append(exc)
                uncertain.add((w, b))
            b += 1

    async def reader() -> None:
        nonlocal torn_reads, reads
        s = store.session("run")
        while not stop.is_set():
            limit = random.choice([None, 25])
            try:
                items = await s.get_items(limit=limit)
            except DatabaseConnectionError as exc:
                errors.append(exc)
                continue
            if limit is not None:  # a tail may start mid-batch: check from the first batch start
                items = items[next((i for i, x in enumerate(items) if x["k"] == 0), len(items)) :]
            reads += 1
            torn_reads += batch_check(items)[1]

    async def killer() -> int:
        rounds = 0
        while not stop.is_set():
            await asyncio.sleep(random.uniform(0.02, 0.1))
            await terminate(admin, app)
            rounds += 1
        return rounds

    tasks = [asyncio.create_task(writer(w)) for w in range(8)]
    tasks += [asyncio.create_task(reader()) for _ in range(2)]
    killing = asyncio.create_task(killer())
    await asyncio.sleep(duration)
    stop.set()
    kills = await killing
    await asyncio.gather(*tasks)
    await terminate(admin, app)  # the pool's idle survivors too
    await wait_gone(admin, app)

    items = await store.session("run").get_items()  # the next operation: must just work
    whole, torn = batch_check(items)
    lost = len(acked - set(whole))
    unexpected = len(set(whole) - acked - uncertain)
    for exc in errors:
        check_message(exc)
    ledger.add(
        "Lost connection",
        "8 writers + 2 readers while our backends are terminated every 20-100 ms",
        times=len(acked) + len(uncertain),
        lost=lost + torn + unexpected + torn_reads,
        unit="batches",
        note=(
            f"{kills} termination rounds over {duration:.0f}s; {len(errors)} operations "
            f"interrupted, each a DatabaseConnectionError naming the host, none showing the "
            f"password; of {len(uncertain)} interrupted batches "
            f"{len(uncertain & set(whole))} were applied whole, the rest not at all"
        ),
    )
    assert errors, "no operation was interrupted: the test did not test anything"
    assert (lost, torn, unexpected, torn_reads) == (0, 0, 0, 0)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_server_down_at_start(names: TableNames, ledger: Ledger) -> None:
    """A closed port or an unknown host: a DatabaseConnectionError naming it, never the password."""
    port = closed_port()
    cases = {
        f"postgresql://root:{PASSWORD}@127.0.0.1:{port}/test": f"127.0.0.1:{port}",
        f"postgresql://root:{PASSWORD}@no-such-host.invalid:5432/test": "no-such-host.invalid",
    }
    unclear = 0
    for url, where in cases.items():
        for create in (False, True):
            store = SessionStore.from_url(
                url,
                sessions_table=names.sessions,
                messages_table=names.messages,
                create_tables=create,
            )
            for call in (
                lambda s: s.session("a").get_items(),
                lambda s: s.session("a").add_items([{"x": 1}]),
                lambda s: s.list_sessions(),
            ):
                with pytest.raises(DatabaseConnectionError) as info:
                    await call(store)
                rendered = "".join(traceback.format_exception(info.value))
                unclear += where not in str(info.value) or PASSWORD in rendered
            await store.close()
    ledger.add(
        "Lost connection",
        "server down at start (closed port, unknown host): get/add/list, with and without "
        "create_tables",
        times=12,
        lost=unclear,
        unit="calls",
        backend="postgres (down)",
        note="'lost' counts errors that were untyped, did not name the host or showed the password",
    )
    assert unclear == 0


async def test_sqlite_file_that_cannot_be_opened(tmp_path: Any, ledger: Ledger) -> None:
    """A SQLite path in a missing directory: a DatabaseConnectionError naming the path."""
    path = tmp_path / "missing" / "store.db"
    async with SessionStore.from_url(f"sqlite:///{path}", create_tables=True) as store:
        with pytest.raises(DatabaseConnectionError, match=r"missing/store\.db"):
            await store.session("a").add_items([{"x": 1}])
        # aiosqlite stops its worker thread after a failed connect; let it finish while the
        # loop is still open, or the thread reports "Event loop is closed".
        await asyncio.sleep(0.1)
    ledger.add(
        "Lost connection",
        "SQLite file in a directory that does not exist",
        times=1,
        backend="sqlite-file",
    )
