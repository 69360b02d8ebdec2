"""An advanced session's turns, usage and branch names, carried by ``agents-memory copy``.

The items cross first (:mod:`agents_memory._admin._transfer`); then, for each
source session holding structure, usage or branch-name rows, one transaction on
the target replaces that session's rows with the source's. A structure row
names its item by position, and positions may differ between the databases (a
popped item leaves a gap the copy closes, a resumed copy appends after the
target's counter): the k-th item of the source session is the k-th of the target
(a copy keeps the order), so items are matched by rank.

That match holds only when the target session holds exactly as many items as
the source: a session copied whole (new, ``resume``d or ``replace``d). One that
differs (``append`` or ``skip`` kept the target's own items, a corrupt source row
was skipped) is left as it is and counted in ``advanced_skipped``. Running the
copy again repeats the replacement: same rows, no duplicates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Table, bindparam, delete, insert, select, union

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


class _Tables:
    def __init__(self, backend: Backend) -> None:
        models = get_models(backend.names)
        self.sessions: Table = models.Session.__table__
        self.messages: Table = models.Message.__table__
        self.structure: Table = models.Structure.__table__
        self.usage: Table = models.TurnUsage.__table__
        self.branches: Table = models.Branch.__table__


async def _advanced_ids(src: Backend, t: _Tables) -> list[str]:
    """Source sessions (with a session row) holding any advanced row, in id order."""
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


async def _read(src: Backend, t: _Tables, sid: str) -> dict[str, Sequence[Any]]:
    m, s, u, b = t.messages.c, t.structure.c, t.usage.c, t.branches.c
    async with src.reading() as conn:
        return {
            "ids": (
                await conn.execute(
                    select(m.position).where(m.session_id == sid).order_by(m.position)
                )
            ).all(),
            "structure": (
                await conn.execute(
                    select(s.message_position, s.created_at, *(s[c] for c in _STRUCTURE))
                    .where(s.session_id == sid)
                    .order_by(s.branch_id, s.sequence_number)
                )
            ).all(),
            "usage": (
                await conn.execute(
                    select(u.created_at, *(u[c] for c in _USAGE))
                    .where(u.session_id == sid)
                    .order_by(u.branch_id, u.user_turn_number)
                )
            ).all(),
            "branches": (
                await conn.execute(select(b.branch_id, b.created_at).where(b.session_id == sid))
            ).all(),
        }


async def _write(dst: Backend, t: _Tables, sid: str, rows: dict[str, Sequence[Any]]) -> bool:
    """Replace the target session's advanced rows with the source's; ``False``: not matched."""
    m = t.messages.c
    stamp = dst.db.stamp
    source_ids = [int(r[0]) for r in rows["ids"]]
    async with dst.transaction() as conn:
        # The session row first: the lock every advanced writer of this session takes.
        sessions = t.sessions
        await conn.execute(
            sessions.update()
            .where(sessions.c.session_id == sid)
            .values(updated_at=sessions.c.updated_at)
        )
        target_ids = [
            int(i)
            for i in (
                await conn.execute(
                    select(m.position).where(m.session_id == sid).order_by(m.position)
                )
            ).scalars()
        ]
        if len(target_ids) != len(source_ids):
            return False
        to_target = dict(zip(source_ids, target_ids, strict=True))
        for table in (t.structure, t.usage, t.branches):
            await conn.execute(delete(table).where(table.c.session_id == sid))
        structure = [
            {
                "session_id": sid,
                "message_position": to_target[int(r[0])],
                "b_created": stamp(r[1]),
                **dict(zip(_STRUCTURE, r[2:], strict=True)),
            }
            for r in rows["structure"]
            if int(r[0]) in to_target
        ]
        usage = [
            {"session_id": sid, "b_created": stamp(r[0]), **dict(zip(_USAGE, r[1:], strict=True))}
            for r in rows["usage"]
        ]
        branches = [
            {"session_id": sid, "branch_id": r[0], "b_created": stamp(r[1])}
            for r in rows["branches"]
        ]
        for table, values in ((t.structure, structure), (t.usage, usage), (t.branches, branches)):
            if values:
                # Times bound as the column takes them (SQLite: its own text), as copies do.
                kind = dst.db.stamp_type(table.c.created_at.type)
                statement = insert(table).values(created_at=bindparam("b_created", type_=kind))
                await conn.execute(statement, values)
    return True


async def carry_advanced(src: Backend, dst: Backend) -> tuple[int, int]:
    """Carry every advanced session's rows; ``(sessions carried, sessions left as they were)``."""
    ts, td = _Tables(src), _Tables(dst)
    carried = skipped = 0
    for sid in await _advanced_ids(src, ts):
        if await _write(dst, td, sid, await _read(src, ts, sid)):
            carried += 1
        else:
            skipped += 1
    return carried, skipped
