"""What the encryption tests share: a store on the test's engine and tables, and the rows as stored.

A module beside the tests (like ``local_http``), not a conftest import: ``conftest`` is an
ambiguous module name in a full run.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory import Keyring, SessionStore, TableNames, get_models


def store_on(engine: AsyncEngine, names: TableNames, keyring: Keyring | None) -> SessionStore:
    """A store on ``names`` (created if missing), encrypting with ``keyring`` (or not)."""
    return SessionStore(
        engine,
        sessions_table=names.sessions,
        messages_table=names.messages,
        create_tables=True,
        encryption=keyring,
    )


async def stored(engine: AsyncEngine, names: TableNames) -> list[str]:
    """Every ``message_data`` as stored (envelopes unopened), in id order."""
    m = get_models(names).Message.__table__
    async with engine.connect() as conn:
        return [
            str(r[0])
            for r in await conn.execute(
                select(m.c.message_data).order_by(m.c.session_id, m.c.position)
            )
        ]
