"""The two processes of ``test_pgbouncer.py``: one only reads, the other clears other sessions.

Kept apart from the test module so that a spawned child imports the library and this
file only, not pytest's fixtures. Each process says ``"ready"`` on its pipe, waits for
``go`` (set once both are ready), runs for at most ``DURATION`` seconds and ``MAX_OPS``
operations, counts every operation it finished, successful or not, in a shared counter
(so each side can tell how far the other got while it ran) and sends a summary dict on
its pipe. Errors are counted and kept as text, never raised: the test decides.
"""

from __future__ import annotations

import asyncio
import time
from multiprocessing.connection import Connection
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event
from typing import Any

from agents_memory import SessionStore

VICTIM = "victim"
VICTIM_ITEMS = 200
DURATION = 3.0  # seconds of racing, at most
MAX_OPS = 5000  # operations per process, at most
GO_TIMEOUT = 120.0  # seconds a child waits for the parent's start signal
KEPT_ERRORS = 5  # error messages kept per process (all are counted)

# The start signal, this process's operation counter, the other process's counter.
Shared = tuple[Event, "Synchronized[int]", "Synchronized[int]"]


def victim_items() -> list[Any]:
    """The items ``victim`` holds, in order, before and (if reads change nothing) after."""
    return [{"role": "user", "content": f"victim item {i}", "i": i} for i in range(VICTIM_ITEMS)]


class _Tally:
    """What one process did: operations (tried), errors among them, the other side's progress."""

    def __init__(self, mine: Synchronized[int], other: Synchronized[int]) -> None:
        self.mine = mine
        self.other = other
        self.ops = 0
        self.errors = 0
        self.error_texts: list[str] = []
        self.other_at_first: int | None = None
        self.other_at_last: int | None = None
        self.started = self.ended = 0.0

    def done(self) -> None:
        """One operation finished (either way): count it, and note how far the other is."""
        self.ops += 1
        with self.mine.get_lock():
            self.mine.value += 1
        seen = self.other.value
        if self.other_at_first is None:
            self.other_at_first = seen
        self.other_at_last = seen

    def failed(self, exc: BaseException) -> None:
        """The operation just counted raised ``exc``."""
        self.errors += 1
        if len(self.error_texts) < KEPT_ERRORS:
            self.error_texts.append(f"{type(exc).__name__}: {exc}"[:400])

    def summary(self) -> dict[str, Any]:
        return {
            "ops": self.ops,
            "errors": self.errors,
            "error_texts": self.error_texts,
            "other_progress": (self.other_at_last or 0) - (self.other_at_first or 0),
            "window": (self.started, self.ended),
        }


async def _read_victim(url: str, tables: tuple[str, str], shared: Shared, out: Connection) -> None:
    """Process A: read ``victim`` in a loop, nothing else; record what every read returned."""
    go, mine, other = shared
    expected = victim_items()
    tally = _Tally(mine, other)
    lengths: dict[int, int] = {}  # items returned -> how many reads returned that many
    out_of_order = 0  # reads with 200 items that were not the 200 items in order
    store = SessionStore.from_url(url, sessions_table=tables[0], messages_table=tables[1])
    try:
        session = store.session(VICTIM)
        out.send("ready")
        if not go.wait(GO_TIMEOUT):
            return  # the parent gave up; it reports the missing summary
        tally.started = time.time()
        deadline = time.monotonic() + DURATION
        for _ in range(MAX_OPS):
            if time.monotonic() > deadline:
                break
            try:
                items = await session.get_items()
            except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
                tally.done()
                tally.failed(exc)
                continue
            tally.done()
            lengths[len(items)] = lengths.get(len(items), 0) + 1
            if len(items) == VICTIM_ITEMS and items != expected:
                out_of_order += 1
        tally.ended = time.time()
    finally:
        await store.close()
    out.send(tally.summary() | {"lengths": lengths, "out_of_order": out_of_order})


async def _churn_others(url: str, tables: tuple[str, str], shared: Shared, out: Connection) -> None:
    """Process B: append to, read and clear sessions other than ``victim``, in a loop."""
    go, mine, other = shared
    tally = _Tally(mine, other)
    store = SessionStore.from_url(url, sessions_table=tables[0], messages_table=tables[1])
    try:
        out.send("ready")
        if not go.wait(GO_TIMEOUT):
            return  # the parent gave up; it reports the missing summary
        tally.started = time.time()
        deadline = time.monotonic() + DURATION
        for n in range(MAX_OPS):
            if time.monotonic() > deadline:
                break
            session = store.session(f"other-{n % 8}")
            try:
                match n % 3:
                    case 0:  # clear another session
                        await store.session(f"other-{(n + 3) % 8}").clear_session()
                    case 1:
                        await session.add_items([{"role": "user", "content": f"b {n}"}] * 5)
                    case _:
                        await session.get_items()
            except Exception as exc:  # noqa: BLE001 - every failure is counted and reported
                tally.failed(exc)
            tally.done()
        tally.ended = time.time()
    finally:
        await store.close()
    out.send(tally.summary())


def reader(url: str, tables: tuple[str, str], shared: Shared, out: Connection) -> None:
    """Entry point of process A; ``shared`` is (go, A's counter, B's counter)."""
    asyncio.run(_read_victim(url, tables, shared, out))
    out.close()


def churner(url: str, tables: tuple[str, str], shared: Shared, out: Connection) -> None:
    """Entry point of process B; ``shared`` is (go, B's counter, A's counter)."""
    asyncio.run(_churn_others(url, tables, shared, out))
    out.close()
