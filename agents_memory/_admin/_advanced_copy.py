"""An advanced session's turns, usage and branch names, carried by ``copy``, ``export``, ``import``.

The items cross first (:mod:`agents_memory._admin._transfer`); then, for each
source session holding structure, usage or branch-name rows, one transaction on
the target replaces that session's rows with the source's. A structure row
names its item by position, and positions may differ between the databases (a
popped item leaves a gap the copy closes, a resumed copy appends after the
target's counter): the k-th item of the source session is the k-th of the target
(a copy keeps the order), so items are matched by rank. An export writes the rank
(:class:`AdvancedRows`, one line per row: ``_jsonl``), and an import matches it
the same way.

That match holds only when the target session holds exactly as many items as
the source: a session copied whole (new, ``resume``d or ``replace``d). One that
differs (``append`` or ``skip`` kept the target's own items, a corrupt source row
was skipped) is left as it is and counted in ``advanced_skipped``. Running the
copy again repeats the replacement: same rows, no duplicates.

A session cleared in the source has no session row and no items, but the
branch names it used stay used (revision 0005): they are carried too, added to
the target's names of that id (never deleting one the target has), and counted
in ``advanced_cleared``. Clear generations are not carried: they tell objects
connected to the source's database that it was cleared, and none is connected
to the target yet.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import AsyncIterator, Sequence
from typing import Any

from sqlalchemy import Table, bindparam, delete, exists, insert, select, union
from sqlalchemy.ext.asyncio import AsyncConnection

from agents_memory._sqlalchemy._backend import Backend
from agents_memory.models import get_models

_STRUCTURE = (
    "branch_id",
    "message_type",
    "sequence_number",
    "user_turn_number",
    "branch_turn_number",
    "tool_name",
)
_USAGE = (
    "branch_id",
    "user_turn_number",
    "requests",
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "input_tokens_details",
    "output_tokens_details",
)


@dataclasses.dataclass(frozen=True, slots=True)
class TurnRow:
    """Where one item sits in one branch; ``item`` is its rank (0: the session's oldest item)."""

    item: int
    created_at: dt.datetime
    branch_id: str
    message_type: str
    sequence_number: int
    user_turn_number: int | None
    branch_turn_number: int | None
    tool_name: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class UsageRow:
    """The token usage of one user turn of one branch (details: JSON text, as stored)."""

    created_at: dt.datetime
    branch_id: str
    user_turn_number: int
    requests: int
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: str | None
    output_tokens_details: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class BranchName:
    """A branch name the session has used (it stays used)."""

    branch_id: str
    created_at: dt.datetime


@dataclasses.dataclass(slots=True)
class AdvancedRows:
    """One session's advanced rows, its items named by rank among ``items`` items."""

    items: int
    turns: list[TurnRow] = dataclasses.field(default_factory=list)
    usage: list[UsageRow] = dataclasses.field(default_factory=list)
    branches: list[BranchName] = dataclasses.field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.turns or self.usage or self.branches)


class _Tables:
    def __init__(self, backend: Backend) -> None:
        models = get_models(backend.names)
        self.sessions: Table = models.Session.__table__
        self.messages: Table = models.Message.__table__
        self.structure: Table = models.Structure.__table__
        self.usage: Table = models.TurnUsage.__table__
        self.branches: Table = models.Branch.__table__


async def advanced_ids(src: Backend) -> list[str]:
    """Source sessions (with a session row) holding any advanced row, in id order."""
    t = _Tables(src)
    held = union(
        select(t.structure.c.session_id),
        select(t.usage.c.session_id),
        select(t.branches.c.session_id),
    ).subquery()
    query = (
        select(t.sessions.c.session_id)
        .where(t.sessions.c.session_id.in_(select(held.c.session_id)))
        .order_by(t.sessions.c.session_id)
    )
    async with src.reading() as conn:
        return [str(sid) for sid in (await conn.execute(query)).scalars()]


async def read_advanced(src: Backend, sid: str) -> AdvancedRows:
    """A session's advanced rows, with each structure row's item as its rank."""
    t = _Tables(src)
    m, s, u, b = t.messages.c, t.structure.c, t.usage.c, t.branches.c
    async with src.reading() as conn:
        positions = (
            await conn.execute(select(m.position).where(m.session_id == sid).order_by(m.position))
        ).scalars()
        rank = {int(i): n for n, i in enumerate(positions)}
        structure = (
            await conn.execute(
                select(s.message_position, s.created_at, *(s[c] for c in _STRUCTURE))
                .where(s.session_id == sid)
                .order_by(s.branch_id, s.sequence_number)
            )
        ).all()
        usage = (
            await conn.execute(
                select(u.created_at, *(u[c] for c in _USAGE))
                .where(u.session_id == sid)
                .order_by(u.branch_id, u.user_turn_number)
            )
        ).all()
        branches = (
            await conn.execute(
                select(b.branch_id, b.created_at).where(b.session_id == sid).order_by(b.branch_id)
            )
        ).all()
    return AdvancedRows(
        len(rank),
        [TurnRow(rank[int(r[0])], *r[1:]) for r in structure if int(r[0]) in rank],
        [UsageRow(*r) for r in usage],
        [BranchName(*r) for r in branches],
    )


async def cleared_names(src: Backend) -> AsyncIterator[tuple[str, list[BranchName]]]:
    """Each session cleared in the source (names, no session row) with its names, in id order."""
    t = _Tables(src)
    b, s = t.branches.c, t.sessions.c
    query = (
        select(b.session_id, b.branch_id, b.created_at)
        .where(~exists(select(s.session_id).where(s.session_id == b.session_id)))
        .order_by(b.session_id, b.branch_id)
    )
    async with src.reading() as conn:
        rows = (await conn.execute(query)).all()
    current: str | None = None
    names: list[BranchName] = []
    for sid, branch, created in rows:
        if sid != current:
            if current is not None:
                yield current, names
            current, names = str(sid), []
        names.append(BranchName(branch, created))
    if current is not None:
        yield current, names


async def _lock(conn: AsyncConnection, t: _Tables, sid: str) -> None:
    """The session row first: the lock every advanced writer of this session takes."""
    sessions = t.sessions
    await conn.execute(
        sessions.update()
        .where(sessions.c.session_id == sid)
        .values(updated_at=sessions.c.updated_at)
    )


async def _insert(
    conn: AsyncConnection, dst: Backend, table: Table, values: Sequence[dict[str, Any]]
) -> None:
    """Rows with their own times, bound as the column takes them (SQLite: its own text)."""
    if values:
        kind = dst.db.stamp_type(table.c.created_at.type)
        statement = insert(table).values(created_at=bindparam("b_created", type_=kind))
        await conn.execute(statement, list(values))


async def write_advanced(dst: Backend, sid: str, rows: AdvancedRows) -> bool:
    """Replace the target session's advanced rows with ``rows``; ``False``: not matched."""
    t = _Tables(dst)
    m = t.messages.c
    stamp = dst.db.stamp
    async with dst.transaction() as conn:
        await _lock(conn, t, sid)
        target_ids = [
            int(i)
            for i in (
                await conn.execute(
                    select(m.position).where(m.session_id == sid).order_by(m.position)
                )
            ).scalars()
        ]
        if len(target_ids) != rows.items:
            return False
        for table in (t.structure, t.usage, t.branches):
            await conn.execute(delete(table).where(table.c.session_id == sid))
        turns = [
            {
                "session_id": sid,
                "message_position": target_ids[r.item],
                "b_created": stamp(r.created_at),
                **{c: getattr(r, c) for c in _STRUCTURE},
            }
            for r in rows.turns
            if 0 <= r.item < len(target_ids)
        ]
        usage = [
            {
                "session_id": sid,
                "b_created": stamp(r.created_at),
                **{c: getattr(r, c) for c in _USAGE},
            }
            for r in rows.usage
        ]
        branches = [
            {"session_id": sid, "branch_id": r.branch_id, "b_created": stamp(r.created_at)}
            for r in rows.branches
        ]
        await _insert(conn, dst, t.structure, turns)
        await _insert(conn, dst, t.usage, usage)
        await _insert(conn, dst, t.branches, branches)
    return True


async def add_names(dst: Backend, sid: str, names: Sequence[BranchName]) -> None:
    """Reserve ``names`` for ``sid`` in the target too (those it has not reserved already)."""
    t = _Tables(dst)
    b = t.branches.c
    stamp = dst.db.stamp
    async with dst.transaction() as conn:
        await _lock(conn, t, sid)
        query = select(b.branch_id).where(b.session_id == sid)
        present = set((await conn.execute(query)).scalars())
        new: dict[str, BranchName] = {}
        for name in names:
            if name.branch_id not in present:
                new.setdefault(name.branch_id, name)
        values = [
            {"session_id": sid, "branch_id": n.branch_id, "b_created": stamp(n.created_at)}
            for n in new.values()
        ]
        await _insert(conn, dst, t.branches, values)


@dataclasses.dataclass(slots=True)
class Carried:
    """What carrying advanced rows did: sessions carried, left as they were, cleared ones."""

    sessions: int = 0
    skipped: int = 0
    cleared: int = 0

    async def session(self, dst: Backend, sid: str, rows: AdvancedRows) -> None:
        """Carry one session's rows (nothing to do for a session without any)."""
        if not rows:
            return
        if await write_advanced(dst, sid, rows):
            self.sessions += 1
        else:
            self.skipped += 1

    async def names(self, dst: Backend, sid: str, names: Sequence[BranchName]) -> None:
        """Carry the names of a session cleared in the source."""
        await add_names(dst, sid, names)
        self.cleared += 1


async def carry_advanced(src: Backend, dst: Backend) -> Carried:
    """Carry every advanced session's rows, and the names of sessions cleared in the source."""
    carried = Carried()
    for sid in await advanced_ids(src):
        await carried.session(dst, sid, await read_advanced(src, sid))
    async for sid, names in cleared_names(src):
        await carried.names(dst, sid, names)
    return carried
