"""What the group-commit tests share: a turn's item, and waiting for a writer's state."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


def item(w: int, k: int) -> dict[str, Any]:
    """Writer ``w``'s ``k``-th item (unique, so every landed row says whose it is)."""
    return {"type": "message", "role": "user", "content": f"w{w} k{k}"}


async def until(condition: Callable[[], bool], what: str = "the writer") -> None:
    """Wait (event-loop turns, a few ms each) until ``condition`` holds; fail after 20 s."""
    for _ in range(4000):
        if condition():
            return
        await asyncio.sleep(0.005)
    msg = f"{what} never reached the expected state"
    raise AssertionError(msg)
