"""The Agents SDK's ``OpenAIResponsesCompactionSession`` over our sessions swaps history atomically.

The SDK's wrapper rewrites the stored history after ``responses.compact``; over a
session that offers the SDK's ``_atomic_replace_items`` hook it calls that (one
transaction: our ``replace_items``) instead of ``clear_session`` then
``add_items``. These tests run the wrapper with the real ``openai.AsyncOpenAI``
client against a local HTTP server standing in for ``POST /v1/responses/compact``
and show that a reader never sees an empty or partial history meanwhile, and that
the session row (metadata, ``created_at``) survives, which clear-then-add loses.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import agents
import pytest
from agents.memory import OpenAIResponsesCompactionSession
from agents.testing import ScriptedModel, assistant_message
from fake_compact_server import FakeCompactServer
from openai import AsyncOpenAI

from agents_memory import SessionStore, SQLAlchemySession


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


def history(turn: int, size: int) -> list[dict[str, Any]]:
    """``size`` items of one conversation round (tool calls and answers between user turns)."""
    items: list[dict[str, Any]] = []
    for k in range(size):
        if k % 4 == 0:
            items.append({"role": "user", "content": f"q {turn}.{k}", "type": "message"})
        else:
            items.append(
                {"role": "assistant", "content": f"a {turn}.{k} " + "z" * 80, "type": "message"}
            )
    return items


class TimedSession(SQLAlchemySession):
    """Our session, noting when each atomic replacement ran (to line reads up against it)."""

    windows: list[tuple[float, float]]

    async def _atomic_replace_items(self, items: list[Any]) -> bool:
        started = time.perf_counter()
        try:
            return await super()._atomic_replace_items(items)
        finally:
            self.windows.append((started, time.perf_counter()))


def _timed(store: SessionStore, session_id: str) -> TimedSession:
    names = store.table_names
    session = TimedSession(
        session_id,
        engine=store.engine,
        sessions_table=names.sessions,
        messages_table=names.messages,
        create_tables=True,
    )
    session.windows = []
    return session


async def test_compaction_replaces_history_in_one_transaction(
    store: SessionStore, client: AsyncOpenAI, server: FakeCompactServer
) -> None:
    """Forced compaction: the stored history becomes the API's output; the session row stays."""
    inner = store.session("cmp")
    await inner.add_items(history(0, 12))  # type: ignore[arg-type]
    await inner.set_metadata({"user": "u1"})
    before = await store.get_session("cmp")
    assert before is not None
    wrapper = OpenAIResponsesCompactionSession("cmp", inner, client=client, model="gpt-4.1")
    await wrapper.run_compaction({"force": True})
    assert len(server.requests) == 1
    assert len(server.requests[0]["input"]) == 12
    items = await inner.get_items()
    assert [i["type"] for i in items] == ["message", "compaction"]
    assert items[0]["content"][0]["text"] == "summary #1 of 12 items"
    assert items[1]["encrypted_content"] == "opaque-1-12"
    after = await store.get_session("cmp")
    assert after is not None
    # replaced in place: clear_session then add_items would have dropped the row and its tags
    assert after.metadata == {"user": "u1"}
    assert after.created_at == before.created_at
    assert await wrapper.get_items() == items


async def test_reader_never_sees_an_empty_or_partial_history(
    store: SessionStore, client: AsyncOpenAI, server: FakeCompactServer
) -> None:
    """While compactions run, a reader on another session object sees old or new, nothing else.

    Reads that overlapped a replacement in time are counted, so the test shows it
    looked at the moment that matters (clear-then-add leaves the history empty there).
    """
    server.delay = 0.02
    timed = _timed(store, "live")
    reader_view = store.session("live")
    wrapper = OpenAIResponsesCompactionSession("live", timed, client=client, model="gpt-4.1")
    await timed.add_items(history(0, 1500))  # type: ignore[arg-type]
    reads: list[tuple[float, float, list[Any]]] = []
    overlapping = 0
    for round_ in range(1, 5):
        if round_ > 1:
            await timed.add_items(history(round_, 1500))  # type: ignore[arg-type]
        old = await timed.get_items()
        stop = asyncio.Event()

        async def reader(stop: asyncio.Event = stop) -> None:
            while not stop.is_set():
                started = time.perf_counter()
                seen = await reader_view.get_items()
                reads.append((started, time.perf_counter(), seen))
                await asyncio.sleep(0)

        task = asyncio.create_task(reader())
        await wrapper.run_compaction({"force": True})
        stop.set()
        await task
        new = await timed.get_items()
        assert [i["type"] for i in new][-1] == "compaction"
        start, end = timed.windows[-1]
        for r_start, r_end, seen in reads:
            assert seen in (old, new), f"round {round_}: a read saw {len(seen)} items"
            overlapping += r_start < end and r_end > start
        reads.clear()
    assert len(server.requests) == 4
    assert overlapping > 0, "no read overlapped a replacement"


async def test_compaction_cancelled_leaves_old_or_new(
    store: SessionStore, client: AsyncOpenAI, server: FakeCompactServer
) -> None:
    """A compaction cancelled at random points leaves the old or the compacted history."""
    inner = store.session("cancel")
    wrapper = OpenAIResponsesCompactionSession("cancel", inner, client=client, model="gpt-4.1")
    outcomes = {"old": 0, "new": 0}
    for trial in range(12):
        await inner.replace_items(history(trial, 400))  # type: ignore[arg-type]
        old = await inner.get_items()
        task = asyncio.ensure_future(wrapper.run_compaction({"force": True}))
        await asyncio.sleep(0.002 * trial)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        now = await inner.get_items()
        if now == old:
            outcomes["old"] += 1
        else:
            assert [i["type"] for i in now] == ["message", "compaction"], len(now)
            outcomes["new"] += 1
    assert sum(outcomes.values()) == 12


class CountingSession(SQLAlchemySession):
    """A subclass that changes how items are written (here: counts them), not replace_items."""

    added: int

    async def add_items(self, items: list[Any]) -> None:
        """Count, then append as usual."""
        self.added += len(items)
        await super().add_items(items)


async def test_a_subclass_that_writes_its_own_way_is_not_bypassed(
    store: SessionStore, client: AsyncOpenAI
) -> None:
    """Overriding ``add_items`` (not ``replace_items``): the hook declines, the SDK adds through it.

    As the SDK's own sessions do: an inherited atomic swap must not skip what a
    subclass does to items (encrypt, index turns); it then gets clear-then-add.
    """
    names = store.table_names
    inner = CountingSession(
        "sub",
        engine=store.engine,
        sessions_table=names.sessions,
        messages_table=names.messages,
        create_tables=True,
    )
    inner.added = 0
    await inner.add_items(history(0, 12))
    assert await inner._atomic_replace_items([]) is False
    assert len(await inner.get_items()) == 12  # declined: nothing was replaced
    wrapper = OpenAIResponsesCompactionSession("sub", inner, client=client, model="gpt-4.1")
    await wrapper.run_compaction({"force": True})
    assert inner.added == 12 + 2  # the compacted items went through the override
    assert [i["type"] for i in await inner.get_items()] == ["message", "compaction"]


class SwapCounting(SQLAlchemySession):
    """Our session, counting the suffix swaps of the SDK's partial-compaction hook."""

    swaps: list[bool]

    async def _get_compaction_snapshot(self, limit: int, **kw: Any) -> Any:
        snap = await super()._get_compaction_snapshot(limit, **kw)
        assert snap is not None
        swaps = self.swaps

        class Counted:
            items, complete = snap.items, snap.complete

            @staticmethod
            async def replace_suffix(start: int, output: list[Any]) -> bool:
                done = await snap.replace_suffix(start, output)
                swaps.append(done)
                return done

        return Counted()


async def test_runner_compacts_automatically_through_the_hook(
    store: SessionStore, client: AsyncOpenAI, server: FakeCompactServer
) -> None:
    """The ``Runner``'s automatic compaction after a turn swaps through our snapshot hook.

    (SDK 0.24 prefers ``_get_compaction_snapshot`` there; ``_atomic_replace_items`` is
    the manual ``run_compaction`` path, tested above.)
    """
    names = store.table_names
    inner = SwapCounting(
        "auto",
        engine=store.engine,
        sessions_table=names.sessions,
        messages_table=names.messages,
        create_tables=True,
    )
    inner.swaps = []
    session = OpenAIResponsesCompactionSession(
        "auto",
        inner,
        client=client,
        model="gpt-4.1",
        should_trigger_compaction=lambda context: len(context["session_items"]) >= 4,
    )
    model = ScriptedModel([[assistant_message(f"answer {i}")] for i in range(3)])
    agent = agents.Agent(name="a", model=model)
    config = agents.RunConfig(tracing_disabled=True)
    for i in range(3):
        result = await agents.Runner.run(agent, f"question {i}", session=session, run_config=config)
        assert result.final_output == f"answer {i}"
    # turn 1 leaves 2 items (no compaction); turns 2 and 3 compact 4 items each
    assert len(server.requests) == 2
    assert inner.swaps == [True, True]  # each one atomic suffix swap, not clear + add
    assert [i["type"] for i in await inner.get_items()] == ["message", "compaction"]
