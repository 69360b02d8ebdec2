"""The process the kill test SIGKILLs: prunes (trims and deletes) in a loop until killed.

Usage: ``python _prune_child.py URL SESSIONS_TABLE MESSAGES_TABLE``. It prints ``pruning``
once connected, then deletes stale-tagged sessions and trims the others, over and over.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import sys

from agents_memory import SessionStore


async def main(url: str, sessions: str, messages: str) -> None:
    """Prune forever (the parent kills the process at a random moment)."""
    store = SessionStore.from_url(url, sessions_table=sessions, messages_table=messages)
    await store.list_sessions(limit=1)
    print("pruning", flush=True)  # noqa: T201 - the parent waits for this line
    keep = 200
    while True:
        await store.prune(older_than=dt.timedelta(microseconds=1), metadata={"stale": True})
        await store.prune(keep_last=keep, metadata={"stale": False})
        keep = max(1, keep // 2)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
