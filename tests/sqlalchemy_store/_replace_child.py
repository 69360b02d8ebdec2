"""The process that gets killed: replaces one session's history in a loop, acknowledging each.

Generation ``g`` is ``n(g)`` items ``{"g": g, "k": 0..n-1}``: after a SIGKILL the
history must be exactly one generation, whole. Kept apart from the test module so a
forkserver can preload it (and the library) once.
"""

from __future__ import annotations

import asyncio
from multiprocessing.connection import Connection

from agents_memory import SessionStore


def generation(g: int) -> list[dict[str, object]]:
    """The history of generation ``g`` (sizes vary, so a torn swap shows in the count too)."""
    n = 50 + (g * 37) % 400
    return [{"g": g, "k": k, "n": n, "p": "x" * 100} for k in range(n)]


async def _replace_forever(url: str, tables: tuple[str, str], start: int, acks: Connection) -> None:
    store = SessionStore.from_url(url, sessions_table=tables[0], messages_table=tables[1])
    session = store.session("crash")
    await session.get_items(limit=1)  # connected: the parent starts its clock now
    acks.send_bytes(b"ready")
    g = start
    while True:
        await session.replace_items(generation(g))  # type: ignore[arg-type]
        acks.send_bytes(str(g).encode())  # one write(2): in the pipe before the next swap
        g += 1


def main(url: str, tables: tuple[str, str], start: int, acks: Connection) -> None:
    """Entry point of the child process (never returns: it is killed)."""
    asyncio.run(_replace_forever(url, tables, start, acks))
