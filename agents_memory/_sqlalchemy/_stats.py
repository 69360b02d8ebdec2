"""Whole-store totals: what an operator asks first ("how big is it, and what is the biggest?")."""

from __future__ import annotations

import dataclasses
import datetime as dt

from sqlalchemy import func, select

from agents_memory._ids import check_sql_int
from agents_memory._sqlalchemy._backend import Backend


@dataclasses.dataclass(frozen=True, slots=True)
class StoreStats:
    """Totals of one store (one table-name set)."""

    sessions: int
    items: int
    oldest_created_at: dt.datetime | None
    """When the oldest session was created (``None`` for an empty store)."""
    newest_updated_at: dt.datetime | None
    """When a session was last written to (``None`` for an empty store)."""
    largest: list[tuple[str, int]]
    """``(session_id, item_count)`` of the largest sessions, biggest first."""
    largest_bytes: list[int] = dataclasses.field(default_factory=list)
    """The size of each of ``largest`` in bytes: its items as stored (JSON text), in order."""


async def store_stats(backend: Backend, *, largest: int) -> StoreStats:
    """Count sessions and items and find the ``largest`` biggest sessions, in one read."""
    if isinstance(largest, bool) or not isinstance(largest, int) or largest < 0:
        msg = f"largest must be a non-negative int, got {largest!r}"
        raise ValueError(msg)
    check_sql_int("largest", largest)
    s, m = backend.st.sessions.c, backend.st.messages.c
    totals = select(func.count(), func.min(s.created_at), func.max(s.updated_at))
    n_items = func.count().label("n")
    size = func.coalesce(func.sum(backend.db.byte_length(m.message_data)), 0)
    top = (
        select(m.session_id, n_items, size)
        .group_by(m.session_id)
        .order_by(n_items.desc(), m.session_id)
        .limit(largest)
    )
    async with backend.reading() as conn:
        sessions, oldest, newest = (await conn.execute(totals)).one()
        items = (await conn.execute(select(func.count()).select_from(backend.st.messages))).scalar()
        biggest = (await conn.execute(top)).all() if largest else []
    return StoreStats(
        sessions=int(sessions),
        items=int(items or 0),
        oldest_created_at=oldest,
        newest_updated_at=newest,
        largest=[(str(sid), int(n)) for sid, n, _ in biggest],
        largest_bytes=[int(b) for _, _, b in biggest],
    )
