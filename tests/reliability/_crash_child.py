"""The process that gets killed: appends batches in a loop and acknowledges each one on a pipe.

Kept apart from the test module so a forkserver can preload it (and the library)
once, and each killed child starts in milliseconds instead of a second.
"""

from __future__ import annotations

import asyncio
from multiprocessing.connection import Connection

from agents_memory import SessionStore

TASKS = 8
"""Writer tasks in the child: on SQLite, batches queued together share a transaction."""


async def _append_forever(url: str, tables: tuple[str, str], run: int, acks: Connection) -> None:
    store = SessionStore.from_url(url, sessions_table=tables[0], messages_table=tables[1])
    session = store.session("crash")
    await session.get_items(limit=1)  # connected: the parent starts its clock now
    acks.send_bytes(b"ready")

    async def writer(task: int) -> None:
        w = run * 100 + task
        b = 0
        while True:
            n = 1 + (b * 7 + task * 3) % 40
            batch = [{"w": w, "b": b, "k": k, "n": n, "p": "x" * 200} for k in range(n)]
            await session.add_items(batch)
            acks.send_bytes(f"{w} {b}".encode())  # one write(2): in the pipe before the next batch
            b += 1

    await asyncio.gather(*(writer(t) for t in range(TASKS)))


def main(url: str, tables: tuple[str, str], run: int, acks: Connection) -> None:
    """Entry point of the child process (never returns: it is killed)."""
    asyncio.run(_append_forever(url, tables, run, acks))
