"""The hash-partitioned messages layout (Postgres): chosen at upgrade, kept, pruned per session.

A session's operations must touch only that session's partition: every statement
an operation runs on the messages table is EXPLAINed with the parameters it ran
with, and the partitions in its plan are counted. The other databases refuse an
explicit ``partitions=`` and keep their plain layout under the environment default.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from sqlalchemy import event, text
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory import (
    AdvancedSQLAlchemySession,
    SessionStore,
    TableNames,
    create_engine,
    migrations,
)
from agents_memory._databases import postgres
from agents_memory._migrations._layout import PARTITIONS_ENV, resolve_layout


def _postgres(backend: Any) -> None:
    if backend.kind != "postgres":
        pytest.skip(f"hash partitions are a Postgres layout ({backend.id} refuses them: see below)")


# -- choosing the layout ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "env", "expected"),
    [(None, None, None), (0, None, None), (None, "0", None), (8, None, 8), (None, " 16 ", 16)],
)
def test_the_layout_comes_from_the_argument_then_the_environment(
    monkeypatch: pytest.MonkeyPatch, given: int | None, env: str | None, expected: int | None
) -> None:
    if env is None:
        monkeypatch.delenv(PARTITIONS_ENV, raising=False)
    else:
        monkeypatch.setenv(PARTITIONS_ENV, env)
    layout = resolve_layout(given)
    assert layout.partitions == expected
    assert layout.explicit is (given is not None)


@pytest.mark.parametrize(
    ("given", "env", "error", "says"),
    [
        (1, None, ValueError, "2 to 1024"),
        (1025, None, ValueError, "2 to 1024"),
        (-3, None, ValueError, "2 to 1024"),
        (None, "eight", ValueError, "$AGENTS_MEMORY_PARTITIONS"),
        (None, "1", ValueError, "$AGENTS_MEMORY_PARTITIONS"),
        (True, None, TypeError, "int"),
        ("8", None, TypeError, "int"),
    ],
)
def test_a_bad_layout_is_refused_before_any_connection(
    monkeypatch: pytest.MonkeyPatch, given: Any, env: str | None, error: type, says: str
) -> None:
    if env is None:
        monkeypatch.delenv(PARTITIONS_ENV, raising=False)
    else:
        monkeypatch.setenv(PARTITIONS_ENV, env)
    with pytest.raises(error, match=says.replace("$", r"\$")):
        resolve_layout(given)


async def test_other_databases_refuse_explicit_partitions_and_ignore_the_default(
    backend: Any, engine: AsyncEngine, names: TableNames, monkeypatch: pytest.MonkeyPatch
) -> None:
    if backend.kind == "postgres":
        pytest.skip("Postgres takes partitions (the tests below)")
    monkeypatch.delenv(PARTITIONS_ENV, raising=False)
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    with pytest.raises(ValueError, match="Postgres layout"):
        await migrations.upgrade(engine, partitions=4, **kw)
    assert await migrations.current(engine, **kw) is None  # refused before any DDL

    monkeypatch.setenv(PARTITIONS_ENV, "4")  # a deployment default: Postgres' business only
    await migrations.upgrade(engine, **kw)
    assert await migrations.check(engine, **kw) == []


# -- the partitioned layout on Postgres -------------------------------------------------------


async def _partitions(engine: AsyncEngine, names: TableNames) -> list[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT c.relname FROM pg_catalog.pg_inherits i "
                "JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid "
                "JOIN pg_catalog.pg_class p ON p.oid = i.inhparent "
                "JOIN pg_catalog.pg_namespace n ON n.oid = p.relnamespace "
                "WHERE p.relname = :m AND n.nspname = current_schema() ORDER BY c.relname"
            ),
            {"m": names.messages},
        )
        return [r[0] for r in rows]


async def _partition_of(engine: AsyncEngine, names: TableNames, session_id: str) -> str:
    """Which partition holds ``session_id``'s rows (Postgres routes by the hash of the key)."""
    async with engine.connect() as conn:
        table = conn.dialect.identifier_preparer.quote(names.messages)
        found = (
            await conn.execute(
                text(
                    "SELECT DISTINCT tableoid::regclass::text "
                    f"FROM {table} WHERE session_id = :s"  # (the name quoted by the dialect)
                ),
                {"s": session_id},
            )
        ).all()
    assert len(found) == 1, found
    return str(found[0][0]).strip('"')


async def test_upgrade_builds_the_partitions_and_the_store_works_on_them(
    backend: Any, engine: AsyncEngine, names: TableNames, monkeypatch: pytest.MonkeyPatch
) -> None:
    _postgres(backend)
    monkeypatch.delenv(PARTITIONS_ENV, raising=False)
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    await migrations.upgrade(engine, partitions=4, **kw)
    assert await _partitions(engine, names) == sorted(names.partition(i) for i in range(4))
    assert await migrations.check(engine, **kw) == []  # partitions are not tables of the set

    store = SessionStore(engine, **kw)
    try:
        for k in range(12):
            items = [{"role": "user", "content": f"{k}-{i}"} for i in range(3)]
            await store.session(f"s{k}").add_items(items)  # type: ignore[list-item]
        for k in range(12):
            items = await store.session(f"s{k}").get_items()
            assert [i["content"] for i in items] == [f"{k}-{i}" for i in range(3)]
        spread = {await _partition_of(engine, names, f"s{k}") for k in range(12)}
        assert len(spread) > 1  # the hash spreads sessions over partitions
    finally:
        await store.close()

    await migrations.upgrade(engine, **kw)  # no layout asked: the table keeps its own
    assert len(await _partitions(engine, names)) == 4


async def test_another_layout_on_a_built_table_is_refused_and_the_advice_works(
    backend: Any, engine: AsyncEngine, names: TableNames, monkeypatch: pytest.MonkeyPatch
) -> None:
    _postgres(backend)
    monkeypatch.delenv(PARTITIONS_ENV, raising=False)
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    await migrations.upgrade(engine, **kw)  # plain
    store = SessionStore(engine, **kw)
    try:
        for k in range(5):
            await store.session(f"s{k}").add_items([{"content": f"{k}-{i}"} for i in range(4)])
    finally:
        await store.close()

    with pytest.raises(ValueError, match="db downgrade 0005") as refused:
        await migrations.upgrade(engine, partitions=8, **kw)
    assert "no partitions" in str(refused.value)
    assert await _partitions(engine, names) == []  # nothing of the refused run was kept

    # What the message says to do: down to 0005, then up with the layout.
    await migrations.downgrade(engine, revision="0005", **kw)
    await migrations.upgrade(engine, partitions=8, **kw)
    assert len(await _partitions(engine, names)) == 8
    assert await migrations.check(engine, **kw) == []
    store = SessionStore(engine, **kw)
    try:
        for k in range(5):
            items = await store.session(f"s{k}").get_items()
            assert [i["content"] for i in items] == [f"{k}-{i}" for i in range(4)]
            await store.session(f"s{k}").add_items([{"content": "after"}])
            assert (await store.session(f"s{k}").get_items(limit=1))[0]["content"] == "after"
    finally:
        await store.close()


# -- one partition per session operation ------------------------------------------------------


class _Captured:
    """The statements an observed engine runs (observing it selects the SQLAlchemy runner)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.statements: list[tuple[str, Any]] = []
        event.listen(engine.sync_engine, "before_cursor_execute", self._take)

    def _take(
        self,
        _conn: object,
        _cursor: object,
        statement: str,
        parameters: Any,
        _context: object,
        many: bool,
    ) -> None:
        if not many:
            self.statements.append((statement, parameters))

    def take(self) -> list[tuple[str, Any]]:
        taken, self.statements = self.statements, []
        return taken


def _relations(plan: Any) -> Iterator[str]:
    if isinstance(plan, dict):
        if "Relation Name" in plan:
            yield plan["Relation Name"]
        for value in plan.values():
            yield from _relations(value)
    elif isinstance(plan, list):
        for value in plan:
            yield from _relations(value)


@pytest.fixture
async def partitioned(
    backend: Any, names: TableNames, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[AsyncEngine, AsyncEngine]]:
    """A 16-partition set, an observed engine on it and a plain one to EXPLAIN with."""
    _postgres(backend)
    monkeypatch.delenv(PARTITIONS_ENV, raising=False)
    plain = create_engine(backend.url)
    await migrations.upgrade(
        plain, partitions=16, sessions_table=names.sessions, messages_table=names.messages
    )
    observed = create_engine(backend.url)
    try:
        yield observed, plain
    finally:
        await observed.dispose()
        await plain.dispose()


async def test_every_session_operation_touches_one_partition(
    partitioned: tuple[AsyncEngine, AsyncEngine], names: TableNames
) -> None:
    observed, plain = partitioned
    captured = _Captured(observed)
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    partitions = set(await _partitions(plain, names))
    assert len(partitions) == 16
    store = SessionStore(observed, **kw)
    turn = [
        {"role": "user", "content": "weather in Paris? \u00e9t\u00e9"},
        {"type": "function_call", "name": "weather", "call_id": "c1", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"role": "assistant", "content": "sunny"},
    ]
    # Neighbours in other partitions, so a scan of the wrong partition would show.
    for k in range(40):
        await store.session(f"other-{k}").add_items(turn)
    session = store.session("alpha")
    advanced = AdvancedSQLAlchemySession("beta", engine=observed, **kw)

    async def iterate() -> None:
        async for _item in session.iter_items(batch_size=2):
            pass

    operations: list[tuple[str, Any]] = [
        ("add_items", lambda: session.add_items(turn * 3)),
        ("get_items", session.get_items),
        ("get_items(limit)", lambda: session.get_items(limit=3)),
        ("iter_items", iterate),
        ("pop_item", session.pop_item),
        ("replace_items", lambda: session.replace_items(turn)),
        ("set_metadata", lambda: session.set_metadata({"team": "a"})),
        ("fork", lambda: store.fork("alpha", "alpha-2")),
        ("advanced add_items", lambda: advanced.add_items(turn * 2)),
        ("advanced turns", advanced.get_conversation_turns),
        ("advanced find", lambda: advanced.find_turns_by_content("Paris")),
        ("advanced branch", lambda: advanced.create_branch_from_turn(2, "b2")),
        ("advanced add on branch", lambda: advanced.add_items(turn)),
        ("advanced get", advanced.get_items),
        ("advanced pop", advanced.pop_item),
        ("advanced delete branch", lambda: advanced.delete_branch("b2", force=True)),
        ("advanced clear", advanced.clear_session),
        ("clear_session", session.clear_session),
        ("delete_session", lambda: store.delete_session("alpha-2")),
    ]
    checked = 0

    async def explained(statement: str, parameters: Any) -> set[str]:
        """The partitions of the messages table in the statement's plan."""
        async with plain.connect() as conn:
            raw = (
                await conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}", parameters)
            ).scalar()
        plan = json.loads(raw) if isinstance(raw, str) else raw
        return {r for r in _relations(plan) if r in partitions}

    try:
        await session.add_items(turn)  # both sessions exist before the first operation
        await advanced.add_items(turn)
        captured.take()
        for what, operation in operations:
            await operation()
            for statement, parameters in captured.take():
                if names.messages not in statement:
                    continue
                scanned = await explained(statement, parameters)
                allowed = 2 if what == "fork" else 1  # a fork reads one session, writes another
                assert len(scanned) <= allowed, (what, statement, sorted(scanned))
                checked += 1
        # The control: a store-wide statement plans every partition, so the count above
        # would have seen a session operation that did.
        await store.stats()
        fan_out = [await explained(*c) for c in captured.take() if names.messages in c[0]]
        assert partitions in fan_out
    finally:
        await advanced.close()
        await store.close()
    assert checked >= len(operations)  # each operation ran statements on the messages table


async def test_a_run_that_stops_below_the_building_revision(
    backend: Any, engine: AsyncEngine, names: TableNames, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Explicit partitions cannot be honoured there (refused, nothing kept); the default waits."""
    _postgres(backend)
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    monkeypatch.delenv(PARTITIONS_ENV, raising=False)
    with pytest.raises(ValueError, match="stopped at 0003"):
        await migrations.upgrade(engine, revision="0003", partitions=4, **kw)
    assert await migrations.current(engine, **kw) is None

    monkeypatch.setenv(PARTITIONS_ENV, "4")
    await migrations.upgrade(engine, revision="0003", **kw)
    assert await migrations.current(engine, **kw) == "0003"
    await migrations.upgrade(engine, **kw)  # past 0006 now: the default builds the layout
    assert len(await _partitions(engine, names)) == 4


@pytest.mark.parametrize(
    "case", [(None, False), (8, True), (postgres.GENERIC_PLANS_UP_TO + 1, False)]
)
async def test_driver_connections_pin_generic_plans_on_a_few_partitions(
    backend: Any,
    engine: AsyncEngine,
    names: TableNames,
    monkeypatch: pytest.MonkeyPatch,
    case: tuple[int | None, bool],
) -> None:
    """Up to ``GENERIC_PLANS_UP_TO`` partitions our named statements run generic plans.

    The server would plan them afresh on every call there (a generic plan's estimate
    keeps every partition); on the plain layout, or past the limit, nothing is set,
    nor through PgBouncer (the setting would stay on a server connection it hands to
    other clients): there the server connection the lease reaches shows the default.
    """
    _postgres(backend)
    partitions, pinned = case
    pooled = backend.id == "pgbouncer"
    pinned = pinned and not pooled  # a pooler's server connections go to other clients next
    monkeypatch.delenv(PARTITIONS_ENV, raising=False)
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    await migrations.upgrade(engine, partitions=partitions, **kw)
    async with engine.connect() as conn:
        default = (await conn.exec_driver_sql("SHOW plan_cache_mode")).scalar()
    store = SessionStore(engine, **kw)
    try:
        s = store.session("a")
        for k in range(7):  # past the five custom plans the server tries first
            await s.add_items([{"role": "user", "content": str(k)}])
            assert (await s.pop_item()) == {"role": "user", "content": str(k)}
        runner = store._backend._operations()._runner  # type: ignore[attr-defined]
        assert isinstance(runner, postgres.DriverRunner)
        pool = runner._pools.current()
        lease = await pool.acquire()  # the warm connection (LIFO) that ran them
        try:
            mode = await lease.driver.fetchval("SHOW plan_cache_mode")
            plans = await lease.driver.fetch(
                "SELECT generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE name LIKE '\\_\\_agents\\_memory\\_%'"
            )
        finally:
            pool.release(lease)
    finally:
        await store.close()
    assert plans or pooled  # our named statements ran on this connection (unnamed behind one)
    if pinned:
        assert mode == "force_generic_plan"
        assert all(p["custom_plans"] == 0 for p in plans), plans
    else:
        assert mode == default
