"""The process that gets killed: rotates a store's keys back and forth, forever, in small batches.

Kept apart from the test module so a forkserver can preload it (and the library)
once. Each completed pass is acknowledged on the pipe; a kill lands mid-batch,
between batches or between passes.
"""

from __future__ import annotations

import asyncio
from multiprocessing.connection import Connection

from agents_memory import Keyring, SessionStore


async def _rotate_forever(
    url: str, tables: tuple[str, str], keys: dict[str, str], acks: Connection
) -> None:
    keyring = Keyring(keys, current="a")
    store = SessionStore.from_url(
        url, sessions_table=tables[0], messages_table=tables[1], encryption=keyring
    )
    await store.rotate_keys("a", dry_run=True)  # connected: the parent starts its clock now
    acks.send_bytes(b"ready")
    passes = 0
    while True:
        target = "b" if passes % 2 == 0 else "a"
        await store.rotate_keys(target, batch_size=7)
        passes += 1
        acks.send_bytes(f"pass {passes}".encode())


def main(url: str, tables: tuple[str, str], keys: dict[str, str], acks: Connection) -> None:
    """Entry point of the child process (never returns: it is killed)."""
    asyncio.run(_rotate_forever(url, tables, keys, acks))
