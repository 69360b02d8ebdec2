"""Cancellation: a task cancelled at a random point of an operation leaves no half-done state.

Each trial cancels one operation at a random moment (a random number of event-loop
turns, or a random time, within what the operation takes uncancelled) and checks
that the session is exactly as before or exactly as after it. Afterwards the pool
has every connection back and the store still works.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from _support import Ledger, Transactions, scaled

from agents_memory import SessionStore

pytestmark = pytest.mark.reliability

BASE = [{"base": i, "text": "b" * 50} for i in range(30)]


async def measure(op: Callable[[], Awaitable[Any]]) -> tuple[int, float]:
    """Event-loop turns and seconds an operation takes when left alone."""
    turns = 0
    done = False

    async def ticker() -> None:
        nonlocal turns
        while not done:
            turns += 1
            await asyncio.sleep(0)

    tick = asyncio.create_task(ticker())
    started = time.perf_counter()
    await op()
    elapsed = time.perf_counter() - started
    done = True
    await tick
    return turns, elapsed


async def cancel_at_random(op: Callable[[], Awaitable[Any]], turns: int, seconds: float) -> bool:
    """Run ``op`` and cancel it at a random point; True if the cancel landed before it finished."""
    task = asyncio.ensure_future(op())
    if random.random() < 0.5:
        for _ in range(random.randint(0, turns + 1)):
            await asyncio.sleep(0)
    else:
        await asyncio.sleep(random.uniform(0, seconds))
    hit = not task.done()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return hit


OPS = ["add_items", "pop_item", "clear_session", "get_items"]


@pytest.mark.parametrize("op_name", OPS)
async def test_cancelled_operation_is_all_or_nothing(
    store: SessionStore, ledger: Ledger, op_name: str
) -> None:
    """A cancelled add/pop/clear/get leaves the session fully before or after, never between."""
    trials = scaled(40, minimum=10)
    before_count = after_count = between = hits = 0
    for trial in range(trials):
        s = store.session(f"{op_name}-{trial}")
        await s.add_items(BASE)
        batch = [{"t": trial, "k": k, "text": "x" * 100} for k in range(300)]
        ops: dict[str, tuple[Callable[[], Awaitable[Any]], list[dict[str, Any]]]] = {
            "add_items": (lambda s=s, batch=batch: s.add_items(batch), BASE + batch),
            "pop_item": (s.pop_item, BASE[:-1]),
            "clear_session": (s.clear_session, []),
            "get_items": (s.get_items, BASE),
        }
        op, after = ops[op_name]
        if trial == 0:  # how long the operation takes uncancelled, on a twin session
            twin = store.session(f"{op_name}-twin")
            await twin.add_items(BASE)
            twin_ops = {
                "add_items": lambda s=twin, batch=batch: s.add_items(batch),
                "pop_item": twin.pop_item,
                "clear_session": twin.clear_session,
                "get_items": twin.get_items,
            }
            turns, seconds = await measure(twin_ops[op_name])
        hits += await cancel_at_random(op, turns, seconds)
        now = await s.get_items()
        if now == BASE:
            before_count += 1
        elif now == after:
            after_count += 1
        else:
            between += 1
    await asyncio.sleep(0.05)  # let a dropped connection finish closing
    pool = store.engine.pool
    checked_out = pool.checkedout() if hasattr(pool, "checkedout") else 0
    # the engine and pool are still usable
    await store.session("after").add_items([{"ok": True}])
    assert await store.session("after").get_items() == [{"ok": True}]
    ledger.add(
        "Cancellation",
        f"cancel {op_name} at a random point (event-loop turns or time)",
        times=trials,
        lost=between,
        note=(
            f"cancel landed mid-operation {hits}x; left fully before {before_count}x, "
            f"fully after {after_count}x; {checked_out} connections leaked"
        ),
    )
    assert between == 0
    assert checked_out == 0


@pytest.mark.parametrize("op_name", ["add_items", "pop_item", "clear_session"])
async def test_cancelled_operation_in_a_group_is_all_or_nothing(
    store: SessionStore, ledger: Ledger, op_name: str
) -> None:
    """The same with 8 other sessions appending at once: the cancelled batch is whole or absent.

    On a SQLite file it shares its transaction with theirs (group commit); their
    batches must be whole whatever happened to it.
    """
    trials = scaled(40, minimum=10)
    before_count = after_count = between = hits = bystanders_lost = 0
    await store.session("warm").add_items(BASE)  # schema checked: writes take the hot path
    commits = Transactions(store)
    for trial in range(trials):
        s = store.session(f"g-{op_name}-{trial}")
        await s.add_items(BASE)
        batch = [{"t": trial, "k": k, "text": "x" * 100} for k in range(50)]
        ops: dict[str, tuple[Callable[[], Awaitable[Any]], list[dict[str, Any]]]] = {
            "add_items": (lambda s=s, batch=batch: s.add_items(batch), BASE + batch),
            "pop_item": (s.pop_item, BASE[:-1]),
            "clear_session": (s.clear_session, []),
        }
        op, after = ops[op_name]
        others = [store.session(f"g-{op_name}-{trial}-o{o}") for o in range(8)]
        theirs = [[{"o": o, "t": trial, "k": k} for k in range(3)] for o in range(8)]

        async def bystanders(
            others: list[Any] = others, theirs: list[list[dict[str, Any]]] = theirs
        ) -> None:
            await asyncio.gather(*(o.add_items(b) for o, b in zip(others, theirs, strict=True)))

        if trial == 0:
            twin = store.session(f"g-{op_name}-twin")
            await twin.add_items(BASE)
            twin_ops = {
                "add_items": lambda s=twin, batch=batch: s.add_items(batch),
                "pop_item": twin.pop_item,
                "clear_session": twin.clear_session,
            }
            turns, seconds = await measure(twin_ops[op_name])
        side = asyncio.create_task(bystanders())  # queued first: the cancelled one joins them
        hits += await cancel_at_random(op, turns, seconds)
        await side
        now = await s.get_items()
        if now == BASE:
            before_count += 1
        elif now == after:
            after_count += 1
        else:
            between += 1
        for o, b in zip(others, theirs, strict=True):
            bystanders_lost += await o.get_items() != b
    await store.session("after").add_items([{"ok": True}])
    assert await store.session("after").get_items() == [{"ok": True}]
    grouped = f"; {commits.since()} SQLite transactions in all" if commits.counted else ""
    ledger.add(
        "Cancellation",
        f"cancel {op_name} at a random point while 8 other sessions append (grouped commits)",
        times=trials,
        lost=between + bystanders_lost,
        note=(
            f"cancel landed mid-operation {hits}x; left fully before {before_count}x, "
            f"fully after {after_count}x; {bystanders_lost} bystander batches wrong{grouped}"
        ),
    )
    assert (between, bystanders_lost) == (0, 0)
    if commits.counted:  # fewer transactions than batches: the commits really were grouped
        assert commits.since() < trials * 10
