"""Helpers of the reliability suite, importable from its test modules and the report script."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory import SessionStore, TableNames

SCALE = float(os.environ.get("AGENTS_MEMORY_RELIABILITY_SCALE", "1") or "1")
"""Multiplies every repetition count; 1 keeps the suite to a few minutes per database."""

JSON_OUT = os.environ.get("AGENTS_MEMORY_RELIABILITY_JSON")
"""Where the ledger of a run is written (set by report.py)."""


def scaled(n: int, *, minimum: int = 1) -> int:
    """``n`` repetitions times the scale, never fewer than ``minimum``."""
    return max(minimum, round(n * SCALE))


@dataclass
class Record:
    """One line of RELIABILITY.md: what was tried, how often, where, and what was lost."""

    category: str
    tried: str
    backend: str
    times: int
    lost: int
    unit: str = "runs"
    note: str = ""
    test: str = ""
    outcome: str = ""


@dataclass
class Ledger:
    """Collects a test's records; the plugin below writes them out after the run."""

    test: str
    backend: str
    records: list[Record] = field(default_factory=list)

    def add(
        self,
        category: str,
        tried: str,
        *,
        times: int,
        lost: int = 0,
        unit: str = "runs",
        note: str = "",
        backend: str | None = None,
    ) -> None:
        """Record one figure; ``lost`` counts items or batches lost, reordered or torn."""
        self.records.append(
            Record(category, tried, backend or self.backend, times, lost, unit, note, self.test)
        )


def fresh_names() -> TableNames:
    """Unique table names (same rule as the root ``names`` fixture), for extra stores."""
    tag = uuid.uuid4().hex[:10]
    return TableNames(f"t{tag}_sessions", f"t{tag}_messages")


def open_store(url: str, names: TableNames, **kwargs: Any) -> SessionStore:
    """A store owning its engine on ``url``; the one place mapping a backend to sessions."""
    return SessionStore.from_url(
        url, sessions_table=names.sessions, messages_table=names.messages, **kwargs
    )


async def insert_raw(engine: AsyncEngine, names: TableNames, session_id: str, data: Any) -> None:
    """Write a message row behind the library's back, as a broken writer would."""
    import raw_rows  # noqa: PLC0415 - tests/ is not on the child processes' path

    await raw_rows.insert_raw(engine, names, session_id, data)


async def count_rows(engine: AsyncEngine, names: TableNames) -> int:
    """Every message row in the test's table, whatever session it belongs to."""
    async with engine.connect() as conn:
        return int((await conn.execute(text(f"SELECT count(*) FROM {names.messages}"))).scalar())


def batch_check(items: list[dict[str, Any]]) -> tuple[dict[Any, int], int]:
    """Group items tagged ``{"w", "b", "k", "n"}`` into batches; count the torn ones.

    A batch is whole when its ``n`` items appear contiguously with ``k`` = 0..n-1.
    Returns ``{(w, b): n}`` for every whole batch and the number of torn batches.
    """
    whole: dict[Any, int] = {}
    torn = 0
    i = 0
    while i < len(items):
        first = items[i]
        key, n = (first["w"], first["b"]), first["n"]
        chunk = items[i : i + n]
        if [(c["w"], c["b"], c["k"]) for c in chunk] == [(key[0], key[1], k) for k in range(n)]:
            if key in whole:
                torn += 1  # the same batch twice is as wrong as half a batch
            whole[key] = n
            i += n
        else:
            torn += 1
            i += 1
            while i < len(items) and items[i]["k"] != 0:
                i += 1
    return whole, torn


def make_batch(w: int, b: int, n: int, pad: str = "") -> list[dict[str, Any]]:
    """A batch of ``n`` items tagged so :func:`batch_check` can recognise it."""
    return [{"w": w, "b": b, "k": k, "n": n, "p": pad} for k in range(n)]


class Transactions:
    """How many write transactions a SQLite file engine's writer ran: proof that commits grouped.

    On the other runners (servers, in-memory SQLite) there is nothing to count and
    :attr:`counted` is False.
    """

    def __init__(self, store: SessionStore) -> None:
        from agents_memory._databases import sqlite as lite  # noqa: PLC0415

        engine = store.engine
        self.counted = engine.dialect.name == "sqlite" and lite.SQLite.thread_runner_allowed(engine)
        self._writer = lite._threads_for(engine).writer if self.counted else None
        self._start = self._writer.groups if self._writer is not None else 0

    def since(self) -> int:
        """Transactions run since this counter was made."""
        return self._writer.groups - self._start if self._writer is not None else 0

    def note(self, batches: int) -> str:
        """``"N batches in M transactions"`` on the grouped path, else empty."""
        if not self.counted:
            return ""
        return f"{batches} batches in {self.since()} SQLite transactions (group commit)"
