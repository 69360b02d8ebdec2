"""Advanced writes cancelled in a loop, provably mid-operation: the history is old or new only.

Each trial starts a write (an append of a few turns, a replace of the branch, a
branch) and cancels it once the write has sent some but not all of its
statements: a listener counts the statements of the transaction, so the test
proves the cancel landed inside it (``sent at cancel < sent in all``). A started
write is finished before the cancel is raised to the caller, so every trial ends
with the whole new state; turns, structure rows and items always agree.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from typing import Any

import pytest
from advanced_items import answer, call, output, user
from sqlalchemy import event, func, select

from agents_memory import AdvancedSQLAlchemySession, SessionStore, get_models


def _batch(trial: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for t in range(3):
        items += [user(f"t{trial}.{t}"), call("f", f"c{trial}.{t}"), output(f"c{trial}.{t}")]
        items.append(answer(f"a{trial}.{t}"))
    return items


async def _consistent(store: SessionStore, s: AdvancedSQLAlchemySession) -> list[Any]:
    """The branch's items, after checking its turn numbers run 1..n and every item has a row."""
    items = await s.get_items()
    turns = [t["turn"] for t in await s.get_conversation_turns()]
    assert turns == list(range(1, len(turns) + 1))
    assert len(turns) == sum(1 for i in items if i.get("role") == "user")
    structure = get_models(store.table_names).Structure.__table__
    async with store.engine.connect() as conn:
        rows = (
            await conn.execute(
                select(func.count()).where(
                    structure.c.session_id == s.session_id,
                    structure.c.branch_id == s.current_branch_id,
                )
            )
        ).scalar_one()
    assert rows == len(items)
    return items


@pytest.mark.parametrize("op", ["add", "replace", "branch"])
async def test_cancel_mid_write_leaves_old_or_new(store: SessionStore, op: str) -> None:
    """Cancel after a random number of the write's statements; count the cancels that landed."""
    sent = 0

    def count(*_: Any) -> None:
        nonlocal sent
        sent += 1

    s = store.advanced_session("c")
    await s.add_items(_batch(-1))
    event.listen(store.engine.sync_engine, "before_cursor_execute", count)
    rng = random.Random(15)
    landed = 0
    trials = 12
    try:
        for trial in range(trials):
            old = await _consistent(store, s)
            if op == "add":
                new_items = old + _batch(trial)
                write = s.add_items(_batch(trial))
            elif op == "replace":
                new_items = _batch(trial)
                write = s.replace_items(_batch(trial))
            else:
                await s.switch_to_branch("main")
                new_items = (await s.get_items())[:4]
                write = s.create_branch_from_turn(2, f"b{trial}")
            sent = 0
            task = asyncio.ensure_future(write)
            target = rng.randint(1, 4)
            # a counter bumped by a sync listener between the write's statements
            while sent < target and not task.done():  # noqa: ASYNC110
                await asyncio.sleep(0)
            at_cancel = sent
            was_running = not task.done()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            total = sent
            if was_running and 0 < at_cancel < total:
                landed += 1
            if op == "branch":
                assert s.current_branch_id in ("main", f"b{trial}")
                await s.switch_to_branch(f"b{trial}")  # it was created: the write finished
            now = await _consistent(store, s)
            assert now in (old, new_items), f"trial {trial}: {len(now)} items"
            assert now == new_items  # a started write finishes before the cancel is raised
            if op == "branch":
                await s.switch_to_branch("main")
    finally:
        event.remove(store.engine.sync_engine, "before_cursor_execute", count)
    assert landed > 0, "no cancel landed inside a write"
