"""Writing item rows behind the library's back, as a broken (or foreign) writer would.

At head an item needs a position: the writer takes the next one from its session
row's counter (``last_position``), as the library does, in the caller's transaction.
"""

from __future__ import annotations

from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agents_memory import TableNames
from agents_memory.models import get_models


async def next_position(conn: AsyncConnection, names: TableNames, session_id: str) -> int:
    """Take the next position of the (existing) session ``session_id`` on ``conn``."""
    s = get_models(names).Session.__table__
    await conn.execute(
        update(s).where(s.c.session_id == session_id).values(last_position=s.c.last_position + 1)
    )
    position = (
        await conn.execute(select(s.c.last_position).where(s.c.session_id == session_id))
    ).scalar_one()
    return int(position)


async def append_raw(conn: AsyncConnection, names: TableNames, session_id: str, data: str) -> int:
    """Append ``data`` to the (existing) session ``session_id`` on ``conn``; its position."""
    m = get_models(names).Message.__table__
    position = await next_position(conn, names, session_id)
    await conn.execute(
        insert(m).values(session_id=session_id, position=position, message_data=data)
    )
    return position


async def insert_raw(engine: AsyncEngine, names: TableNames, session_id: str, data: str) -> int:
    """:func:`append_raw` in a transaction of its own."""
    async with engine.begin() as conn:
        return await append_raw(conn, names, session_id, data)
