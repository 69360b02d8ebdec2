"""The SDK's partial-compaction hook ``_get_compaction_snapshot`` on our sessions.

On every database and both runners (the driver's, SQLAlchemy's for an observed
engine), and on the stdlib ``SQLiteSession``: the snapshot read, a swap of the
suffix keeps the prefix and the order, a swap after an append, pop, clear or
replace reports ``False`` and changes nothing, of two swaps of one snapshot that
provably run at once exactly one wins, ``prune_prefix`` removes the expired run
of the prefix in the same transaction, encrypted stores and the SDK's
``EncryptedSession`` work, and the real ``Runner`` compacting automatically (real
``openai`` client, local compact server) swaps only the suffix.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import agents
import pytest
from agents.extensions.memory import EncryptedSession
from agents.memory import OpenAIResponsesCompactionSession
from agents.testing import ScriptedModel, assistant_message
from fake_compact_server import FakeCompactServer
from openai import AsyncOpenAI
from sqlalchemy import event, select, text

from agents_memory import Keyring, SessionStore, SQLAlchemySession, SQLiteSession
from agents_memory._databases.base import observed

HISTORY = [
    {"role": "user", "content": f"q {i}"}
    if i % 2 == 0
    else {"role": "assistant", "content": f"a {i}"}
    for i in range(10)
]
OUT = [{"role": "user", "content": "summary"}, {"type": "compaction", "encrypted_content": "x"}]


def _observe(_conn: Any, _cursor: Any, _statement: str, *_: Any) -> None:
    """An execution listener: the engine is observed, so its statements go through SQLAlchemy."""


@pytest.fixture(params=["driver", "sqlalchemy", "stdlib"])
async def pair(
    request: pytest.FixtureRequest, backend: Any, store: SessionStore, tmp_path: Path
) -> AsyncIterator[tuple[Any, Any]]:
    """Two objects on one session: ``SQLAlchemySession`` on one runner, or ``SQLiteSession``.

    The stdlib ``SQLiteSession`` runs once, with the SQLite file backend.
    """
    if request.param == "stdlib":
        if backend.id != "sqlite-file":
            pytest.skip("the stdlib SQLiteSession runs with the sqlite-file backend only")
        path = tmp_path / "lite.db"
        a, b = SQLiteSession("c", path), SQLiteSession("c", path)
        try:
            yield a, b
        finally:
            a.close()
            b.close()
        return
    core = request.param == "sqlalchemy"
    if core:
        event.listen(store.engine.sync_engine, "before_cursor_execute", _observe)
    assert observed(store.engine) == core
    yield store.session("c"), store.session("c")
    if core:
        event.remove(store.engine.sync_engine, "before_cursor_execute", _observe)


async def test_snapshot_reads_the_newest_items(pair: tuple[Any, Any]) -> None:
    """Items oldest first; ``complete`` only when nothing older exists; nothing is written."""
    s, _ = pair
    assert (await s._get_compaction_snapshot(3)).items == []
    assert (await s._get_compaction_snapshot(3)).complete
    await s.add_items(HISTORY)
    snap = await s._get_compaction_snapshot(4)
    assert snap.items == HISTORY[-4:]
    assert snap.complete is False
    assert (await s._get_compaction_snapshot(10)).complete is True
    whole = await s._get_compaction_snapshot(50)
    assert whole.items == HISTORY
    assert whole.complete
    with pytest.raises(ValueError, match="limit"):
        await s._get_compaction_snapshot(0)
    assert await s.get_items() == HISTORY


async def test_swap_replaces_only_the_suffix_in_order(pair: tuple[Any, Any]) -> None:
    """The prefix stays, the output follows it; later appends come after the output."""
    s, other = pair
    await s.add_items(HISTORY)
    snap = await s._get_compaction_snapshot(4)
    assert await snap.replace_suffix(4, []) is False  # an empty suffix: nothing to swap
    assert await snap.replace_suffix(1, OUT) is True
    assert await s.get_items() == HISTORY[:7] + OUT
    await other.add_items([{"role": "user", "content": "next"}])
    assert await s.get_items() == [*HISTORY[:7], *OUT, {"role": "user", "content": "next"}]
    # the same snapshot again: its suffix is gone, so it is stale
    assert await snap.replace_suffix(0, OUT) is False
    assert await s.get_items() == [*HISTORY[:7], *OUT, {"role": "user", "content": "next"}]


WRITES = {
    "append": lambda o: o.add_items([{"role": "user", "content": "late"}]),
    "pop": lambda o: o.pop_item(),
    "clear": lambda o: o.clear_session(),
    "replace": lambda o: o.replace_items(HISTORY),  # the same content, new rows
}


@pytest.mark.parametrize("write", sorted(WRITES))
async def test_a_write_in_between_makes_the_swap_stale(pair: tuple[Any, Any], write: str) -> None:
    """After an append, pop, clear or replace by another object: ``False``, nothing changed."""
    s, other = pair
    await s.add_items(HISTORY)
    snap = await s._get_compaction_snapshot(4)
    await WRITES[write](other)
    before = await s.get_items()
    assert await snap.replace_suffix(0, OUT) is False
    assert await s.get_items() == before
    if write == "clear":
        assert before == []


async def test_subclasses_that_change_items_get_none(rstore: SessionStore) -> None:
    """As the SDK: a subclass that reads or writes its own way (or keeps turns) gets ``None``."""

    class Counting(SQLAlchemySession):
        async def add_items(self, items: list[Any]) -> None:
            await super().add_items(items)

    class Quiet(SQLAlchemySession):
        """Only observes: reads and writes are ours, so the hook is offered."""

    names = rstore.table_names
    kw: dict[str, Any] = {
        "engine": rstore.engine,
        "sessions_table": names.sessions,
        "messages_table": names.messages,
        "create_tables": True,
    }
    assert await Counting("x", **kw)._get_compaction_snapshot(2) is None
    assert await Quiet("x", **kw)._get_compaction_snapshot(2) is not None
    assert await rstore.advanced_session("x")._get_compaction_snapshot(2) is None


async def test_subclass_of_sqlite_session_gets_none(tmp_path: Path) -> None:
    """The stdlib session follows the same rule."""

    class Reading(SQLiteSession):
        async def get_items(self, limit: int | None = None) -> list[Any]:
            return await super().get_items(limit)

    with Reading("x", tmp_path / "r.db") as s:
        assert await s._get_compaction_snapshot(2) is None


async def test_prune_prefix_removes_the_expired_run_in_the_same_swap(pair: tuple[Any, Any]) -> None:
    """The leading run the predicate accepts goes (batch by batch); it stops at the first kept."""
    s, _ = pair
    expired = [{"role": "user", "content": f"old {i}", "old": True} for i in range(7)]
    kept = {"role": "user", "content": "kept", "old": True}
    await s.add_items([*expired, {"role": "user", "content": "fresh"}, kept, *HISTORY[:4]])
    snap = await s._get_compaction_snapshot(3, prune_prefix=lambda item: bool(item.get("old")))
    assert await snap.replace_suffix(0, OUT) is True
    assert await s.get_items() == [{"role": "user", "content": "fresh"}, kept, HISTORY[0], *OUT]


async def _waiters(store: SessionStore, kind: str) -> int:
    """How many statements on this test's sessions table wait for a row lock right now."""
    if kind == "postgres":
        query = text(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND strpos(query, :t) > 0"
        )
    else:
        # Statements on this test's tables still running while the lock is held: waiting.
        # (The processlist shows a statement for its whole wait, where a row of
        # innodb_trx may show none on a busy server.)
        query = text(
            "SELECT count(*) FROM information_schema.processlist "
            "WHERE command = 'Query' AND id <> connection_id() AND locate(:t, info) > 0"
        )
    async with store.engine.connect() as conn:
        return int((await conn.execute(query, {"t": store.table_names.sessions})).scalar_one())


async def test_two_swaps_of_one_snapshot_at_once_one_wins(
    backend: Any, rstore: SessionStore
) -> None:
    """Both swaps start while the session is locked (seen waiting); exactly one replaces.

    On a server both are seen waiting for the session row's lock; on a SQLite file
    another connection holds the write lock, so neither can finish until it is let go.
    """
    s = rstore.session("c")
    await s.add_items(HISTORY)
    snap = await s._get_compaction_snapshot(4)
    one = [{"role": "user", "content": "one"}]
    two = [{"role": "user", "content": "two"}]
    if backend.kind == "sqlite":
        if backend.id == "sqlite-memory":
            results = await asyncio.gather(snap.replace_suffix(0, one), snap.replace_suffix(0, two))
        else:
            blocker = sqlite3.connect(str(rstore.engine.url.database), isolation_level=None)
            try:
                blocker.execute("BEGIN IMMEDIATE")
                tasks = [
                    asyncio.ensure_future(snap.replace_suffix(0, one)),
                    asyncio.ensure_future(snap.replace_suffix(0, two)),
                ]
                await asyncio.sleep(0.3)
                assert not any(t.done() for t in tasks)  # neither can pass the held lock
            finally:
                blocker.rollback()
                blocker.close()
            results = await asyncio.gather(*tasks)
    else:
        sessions = rstore._backend.st.sessions
        async with rstore.engine.connect() as conn, conn.begin():
            query = select(sessions.c.session_id).where(sessions.c.session_id == "c")
            await conn.execute(query.with_for_update())
            tasks = [
                asyncio.ensure_future(snap.replace_suffix(0, one)),
                asyncio.ensure_future(snap.replace_suffix(0, two)),
            ]
            for _ in range(1500):
                await asyncio.sleep(0.02)
                assert not any(t.done() for t in tasks), [t.result() for t in tasks if t.done()]
                if await _waiters(rstore, backend.kind) == 2:
                    break
            else:
                pytest.fail("the two swaps were never both waiting on the session's lock")
        results = await asyncio.gather(*tasks)
    assert sorted(results) == [False, True]
    winner = one if results[0] else two
    assert await s.get_items() == HISTORY[:6] + winner


async def test_encrypted_store_and_the_sdks_encrypted_session(engine: Any, names: Any) -> None:
    """Snapshot items are opened; the swap seals; ``EncryptedSession`` passes the hook on."""
    keyring = Keyring({"k1": Keyring.generate_key()}, current="k1")
    store = SessionStore(
        engine,
        sessions_table=names.sessions,
        messages_table=names.messages,
        create_tables=True,
        encryption=keyring,
    )
    try:
        s = store.session("e")
        await s.add_items(HISTORY)
        snap = await s._get_compaction_snapshot(4)
        assert snap.items == HISTORY[-4:]
        assert await snap.replace_suffix(2, OUT) is True
        assert await s.get_items() == HISTORY[:8] + OUT
        m = store._backend.st.messages
        async with engine.connect() as conn:
            raw = (await conn.execute(select(m.c.message_data))).scalars().all()
        assert all(r.startswith("am1:") for r in raw)
        # The SDK's EncryptedSession over ours: its snapshot goes through our hook.
        wrapped = EncryptedSession(
            session_id="w", underlying_session=store.session("w"), encryption_key="k" * 32
        )
        await wrapped.add_items(HISTORY[:4])
        esnap = await wrapped._get_compaction_snapshot(3)
        assert esnap is not None
        assert esnap.items == HISTORY[1:4]
        assert await esnap.replace_suffix(1, OUT) is True
        assert await wrapped.get_items() == HISTORY[:2] + OUT
    finally:
        await store.close()


# -- the real Runner ----------------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[FakeCompactServer]:
    s = FakeCompactServer()
    s.start()
    yield s
    s.stop()


@pytest.fixture
async def client(server: FakeCompactServer) -> AsyncIterator[AsyncOpenAI]:
    c = AsyncOpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
    yield c
    await c.close()


async def _run_once(session: Any) -> None:
    agent = agents.Agent(name="a", model=ScriptedModel([[assistant_message("answer")]]))
    config = agents.RunConfig(tracing_disabled=True)
    result = await agents.Runner.run(agent, "new question", session=session, run_config=config)
    assert result.final_output == "answer"


async def test_runner_compacts_only_the_suffix(
    rstore: SessionStore, client: AsyncOpenAI, server: FakeCompactServer
) -> None:
    """The model saw the last 2 stored items: only that exchange is compacted; the rest stays."""
    inner = rstore.session("auto", session_settings={"limit": 2})
    await inner.add_items(HISTORY)
    session = OpenAIResponsesCompactionSession(
        "auto", inner, client=client, model="gpt-4.1", should_trigger_compaction=lambda _: True
    )
    await _run_once(session)
    assert len(server.requests) == 1
    sent = server.requests[0]["input"]
    assert [i.get("content") for i in sent[:3]] == ["q 8", "a 9", "new question"]
    assert len(sent) == 4  # + the model's answer
    stored = await inner.get_items(limit=100)
    assert stored[:8] == HISTORY[:8]  # the prefix, untouched
    assert [i.get("type") for i in stored[8:]] == ["message", "compaction"]
    assert stored[8]["content"][0]["text"] == "summary #1 of 4 items"


async def test_runner_compacts_only_the_suffix_on_sqlite_session(
    tmp_path: Path, client: AsyncOpenAI, server: FakeCompactServer
) -> None:
    """The same through the stdlib ``SQLiteSession``."""
    with SQLiteSession("auto", tmp_path / "r.db", session_settings={"limit": 2}) as inner:
        await inner.add_items(HISTORY)
        session = OpenAIResponsesCompactionSession(
            "auto", inner, client=client, model="gpt-4.1", should_trigger_compaction=lambda _: True
        )
        await _run_once(session)
        assert len(server.requests) == 1
        stored = await inner.get_items(limit=100)
        assert stored[:8] == HISTORY[:8]
        assert [i.get("type") for i in stored[8:]] == ["message", "compaction"]
