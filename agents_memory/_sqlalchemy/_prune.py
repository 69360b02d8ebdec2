"""Retention: delete old or expired sessions and trim long ones, safely, on a live database.

The policy runs as many short transactions, never one long one, and walks the
sessions by keyset (``session_id > last``), so memory and lock time stay bounded
whatever the size of the store. Every step re-checks its condition inside its own
transaction, which is what makes it safe beside application traffic, beside a
second prune, and when killed at any moment:

* **Deleting a session** (not updated since the cut-off, or expired): the batch's
  session rows are first selected ``FOR UPDATE`` with the condition (row locks on
  Postgres and MySQL; SQLite has one writer, and each delete below re-checks the
  condition itself), then their items and rows are deleted with the condition
  repeated. A session written to after it was listed no longer matches and is kept.
  A session with more items than one batch first loses its oldest items in
  batches (each guarded by the same condition), so a kill leaves it a contiguous
  newest suffix, and a write arriving meanwhile stops the deletion.
* **Trimming a session** to its newest ``N``: at the start of the trim, the position
  of its ``N``-th newest item is read (``keep_from``); only items at a smaller
  position are deleted, oldest first, in batches. Items take their positions from
  their session row's counter, which only grows, under that row's lock, so an item
  added after the trim started has a larger position and is never deleted, and what
  is left is always a newest suffix.

Two prunes at once delete the same rows; a row already gone is simply not
counted twice (each report counts what its own statements deleted).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy import (
    ColumnElement,
    and_,
    bindparam,
    delete,
    exists,
    false,
    func,
    not_,
    or_,
    select,
    true,
)
from sqlalchemy.ext.asyncio import AsyncConnection

from agents_memory._databases.base import check_heads, heads_where
from agents_memory._ids import check_sql_int
from agents_memory._sqlalchemy._backend import Backend
from agents_memory._sqlalchemy._metadata import FilterValue, metadata_filter
from agents_memory._sqlalchemy._timestamps import utcnow
from agents_memory.models import get_models

T = TypeVar("T")

SESSION_BATCH = 100
"""Sessions listed (and, when whole sessions go, deleted) per transaction."""
ITEM_BATCH = 1000
"""Items deleted per transaction when trimming, or before deleting a big session."""


@dataclasses.dataclass(frozen=True, slots=True)
class PruneReport:
    """What :meth:`SessionStore.prune` deleted (or, with ``dry_run``, would delete)."""

    sessions_deleted: int
    """Whole sessions removed: not updated since ``older_than``, or expired."""
    sessions_trimmed: int
    """Sessions that kept only their newest ``keep_last`` items."""
    items_deleted: int
    """Items removed, from deleted and trimmed sessions together."""
    bytes_freed: int | None
    """The size of the removed items as stored (their JSON text, in bytes); ``None`` where
    the database cannot tell. Table files shrink only after the database reuses or
    vacuums the space."""
    dry_run: bool
    """``True``: nothing was deleted; the counts say what a real run would delete now."""


Progress = Callable[[int], None]
"""Told how many more items were deleted (or counted, in a dry run) after each step."""


def validate_policy(older_than: dt.timedelta | None, keep_last: int | None, dry_run: bool) -> None:
    """Refuse a policy that makes no sense before anything is read or deleted."""
    if older_than is not None and (
        not isinstance(older_than, dt.timedelta) or older_than <= dt.timedelta(0)
    ):
        msg = f"older_than must be a positive datetime.timedelta, got {older_than!r}"
        raise ValueError(msg)
    if keep_last is not None:
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0:
            msg = f"keep_last must be a non-negative int, got {keep_last!r}"
            raise ValueError(msg)
        check_sql_int("keep_last", keep_last)
    if not isinstance(dry_run, bool):
        msg = f"dry_run must be a bool, got {dry_run!r}"
        raise TypeError(msg)


class _Pruner:
    """One run of a policy on one backend."""

    def __init__(
        self,
        backend: Backend,
        *,
        older_than: dt.timedelta | None,
        keep_last: int | None,
        metadata: Mapping[str, FilterValue] | None,
        dry_run: bool,
        progress: Progress | None,
    ) -> None:
        self.b = backend
        self.db = backend.db
        self.s = backend.st.sessions
        self.m = backend.st.messages
        models = get_models(backend.names)
        self.kept_after_clear = (models.Branch.__table__, models.ClearGeneration.__table__)
        self.keep_last = keep_last
        self.dry_run = dry_run
        self.progress = progress or (lambda _n: None)
        s = self.s.c
        now = utcnow()
        stamp_type = self.db.stamp_type(s.updated_at.type)
        self.params: dict[str, Any] = {"now": self.db.stamp(now)}
        expired = and_(
            s.expires_at.is_not(None), s.expires_at <= bindparam("now", type_=stamp_type)
        )
        old: ColumnElement[bool] = false()
        if older_than is not None:
            self.params["cutoff"] = self.db.stamp(now - older_than)
            old = s.updated_at < bindparam("cutoff", type_=stamp_type)
        self.doomed: ColumnElement[bool] = or_(old, expired)
        """The sessions the policy deletes whole (re-checked in every delete)."""
        self.chosen: ColumnElement[bool] = (
            true() if metadata is None else metadata_filter(self.db, self.s, metadata)
        )
        self.sessions_deleted = 0
        self.sessions_trimmed = 0
        self.items_deleted = 0
        self.bytes_freed = 0

    # -- plumbing ---------------------------------------------------------------------------------

    async def _write(self, body: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """One short transaction; a deadlock victim (rolled back whole) runs again."""
        return await self.b.retried(body)

    async def _read(self, statement: Any, params: Mapping[str, Any]) -> Sequence[Any]:  # noqa: ANN401
        return await self.b.fetch(statement, {**self.params, **params})

    async def _check_openable(self, conn: AsyncConnection, where: ColumnElement[bool]) -> None:
        """Refuse (the typed error; this batch rolls back) to delete what the keyring can't open.

        A prune, like a clear, never deletes an item because it could not be read:
        a wrong or missing key stops the run with every row of the batch kept.
        """
        rows = (await conn.execute(heads_where(self.m, where), self.params)).all()
        check_heads(rows, self.b.keyring)

    def _size(self) -> Any:  # noqa: ANN401
        return func.coalesce(func.sum(self.db.byte_length(self.m.c.message_data)), 0)

    async def _pages(self, where: ColumnElement[bool]) -> Any:  # noqa: ANN401
        """Yield pages of ``(session_id, item_count)`` matching ``where``, by session id."""
        s, m = self.s.c, self.m.c
        count = select(func.count()).where(m.session_id == s.session_id).scalar_subquery()
        after = bindparam("after", type_=s.session_id.type)
        first = select(s.session_id, count).where(where, self.chosen).order_by(s.session_id)
        page = first.where(s.session_id > after)
        last: str | None = None
        while True:
            query = (first if last is None else page).limit(SESSION_BATCH)
            rows = await self._read(query, {} if last is None else {"after": last})
            if not rows:
                return
            yield [(str(r[0]), int(r[1])) for r in rows]
            if len(rows) < SESSION_BATCH:
                return
            last = str(rows[-1][0])

    # -- deleting whole sessions --------------------------------------------------------------

    async def delete_sessions(self) -> None:
        async for page in self._pages(self.doomed):
            if self.dry_run:
                await self._count_page([sid for sid, _ in page])
                continue
            for sid, n in page:
                if n > ITEM_BATCH:
                    await self._shrink(sid)
            ids = [sid for sid, _ in page]
            await self._write(functools.partial(self._delete, ids=ids))

    async def _count_page(self, ids: list[str]) -> None:
        m = self.m.c
        query = select(func.count(), self._size()).where(m.session_id.in_(ids))
        (n, size), *_ = await self._read(query, {})
        self.sessions_deleted += len(ids)
        self.items_deleted += int(n)
        self.bytes_freed += int(size)
        self.progress(int(n))

    def _still_doomed(self, sid: Any) -> Any:  # noqa: ANN401
        s = self.s.c
        return exists().where(s.session_id == sid, self.doomed)

    async def _shrink(self, sid: str) -> None:
        """Delete a big doomed session's oldest items in batches, while it stays doomed.

        The last batch is left to :meth:`_delete`, which removes it with the session
        row: until then the session keeps a newest suffix, never an empty row.
        """
        m = self.m.c
        mine = m.session_id == bindparam("sid", type_=m.session_id.type)
        beyond = select(m.position).where(mine).order_by(m.position).limit(1).offset(ITEM_BATCH)
        while True:
            rows = await self._read(beyond, {"sid": sid})
            if not rows:
                return
            below = int(rows[0][0])
            deleted = await self._write(
                functools.partial(
                    self._delete_items,
                    sid=sid,
                    condition=and_(m.position < below, self._still_doomed(sid)),
                )
            )
            if deleted == 0:
                return

    async def _delete(self, conn: AsyncConnection, *, ids: list[str]) -> None:
        s, m = self.s.c, self.m.c
        # Locked in session_id order, as a group of appends locks its sessions
        # (postgres_groups): two multi-row lockers in one order never deadlock.
        locked = (
            select(s.session_id)
            .where(s.session_id.in_(ids), self.doomed)
            .order_by(s.session_id)
            .with_for_update()
        )
        mine = [str(r[0]) for r in (await conn.execute(locked, self.params)).all()]
        if not mine:
            return
        still = select(s.session_id).where(s.session_id.in_(mine), self.doomed)
        await self._check_openable(conn, m.session_id.in_(still))
        size_q = select(func.count(), self._size()).where(m.session_id.in_(still))
        _n, size = (await conn.execute(size_q, self.params)).one()
        items = await conn.execute(delete(self.m).where(m.session_id.in_(still)), self.params)
        gone = await conn.execute(
            delete(self.s).where(s.session_id.in_(mine), self.doomed), self.params
        )
        # A deleted session's branch names and clear generation go with it (a clear keeps
        # them; revisions 0005, 0007).
        for table in self.kept_after_clear:
            c = table.c
            await conn.execute(
                delete(table).where(
                    c.session_id.in_(mine),
                    ~exists(select(s.session_id).where(s.session_id == c.session_id)),
                )
            )
        self.sessions_deleted += int(gone.rowcount)
        self.items_deleted += int(items.rowcount)
        self.bytes_freed += int(size)
        self.progress(int(items.rowcount))

    # -- trimming -----------------------------------------------------------------------------

    async def trim_sessions(self) -> None:
        keep = self.keep_last
        if keep is None:
            return
        async for page in self._pages(not_(self.doomed)):
            for sid, n in page:
                if n > keep:
                    await self._trim(sid, keep)

    async def _nth_oldest(self, sid: str, below: int) -> int | None:
        """The position of the ``ITEM_BATCH``-th oldest item below ``below``, or the last one."""
        m = self.m.c
        mine = m.session_id == bindparam("sid", type_=m.session_id.type)
        where = and_(mine, m.position < below)
        nth = select(m.position).where(where).order_by(m.position).limit(1).offset(ITEM_BATCH - 1)
        rows = await self._read(nth, {"sid": sid})
        if rows:
            return int(rows[0][0])
        rows = await self._read(select(func.max(m.position)).where(where), {"sid": sid})
        return None if not rows or rows[0][0] is None else int(rows[0][0])

    async def _trim(self, sid: str, keep: int) -> None:
        m = self.m.c
        mine = m.session_id == bindparam("sid", type_=m.session_id.type)
        if keep == 0:
            newest = await self._read(select(func.max(m.position)).where(mine), {"sid": sid})
            if not newest or newest[0][0] is None:
                return
            keep_from = int(newest[0][0]) + 1
        else:
            nth = (
                select(m.position).where(mine).order_by(m.position.desc()).limit(1).offset(keep - 1)
            )
            rows = await self._read(nth, {"sid": sid})
            if not rows:
                return
            keep_from = int(rows[0][0])
        if self.dry_run:
            query = select(func.count(), self._size()).where(mine, m.position < keep_from)
            (n, size), *_ = await self._read(query, {"sid": sid})
            if n:
                self.sessions_trimmed += 1
                self.items_deleted += int(n)
                self.bytes_freed += int(size)
                self.progress(int(n))
            return
        trimmed = False
        while True:
            upto = await self._nth_oldest(sid, keep_from)
            if upto is None:
                break
            deleted = await self._write(
                functools.partial(
                    self._delete_items, sid=sid, condition=m.position <= upto, keep_from=keep_from
                )
            )
            trimmed = trimmed or deleted > 0
        if trimmed:
            self.sessions_trimmed += 1

    async def _delete_items(
        self,
        conn: AsyncConnection,
        *,
        sid: str,
        condition: ColumnElement[bool],
        keep_from: int | None = None,
    ) -> int:
        """Delete ``sid``'s items matching ``condition`` (and below ``keep_from``)."""
        m = self.m.c
        where = and_(m.session_id == sid, condition)
        if keep_from is not None:
            where = and_(where, m.position < keep_from)
        await self._check_openable(conn, where)
        size = (await conn.execute(select(self._size()).where(where), self.params)).scalar()
        result = await conn.execute(delete(self.m).where(where), self.params)
        n = int(result.rowcount)
        self.items_deleted += n
        self.bytes_freed += int(size or 0) if n else 0
        self.progress(n)
        return n

    def report(self) -> PruneReport:
        return PruneReport(
            sessions_deleted=self.sessions_deleted,
            sessions_trimmed=self.sessions_trimmed,
            items_deleted=self.items_deleted,
            bytes_freed=self.bytes_freed,
            dry_run=self.dry_run,
        )


async def prune(
    backend: Backend,
    *,
    older_than: dt.timedelta | None = None,
    keep_last: int | None = None,
    metadata: Mapping[str, FilterValue] | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> PruneReport:
    """Run a retention policy (see :meth:`SessionStore.prune`)."""
    validate_policy(older_than, keep_last, dry_run)
    pruner = _Pruner(
        backend,
        older_than=older_than,
        keep_last=keep_last,
        metadata=metadata,
        dry_run=dry_run,
        progress=progress,
    )
    await pruner.delete_sessions()
    await pruner.trim_sessions()
    return pruner.report()
