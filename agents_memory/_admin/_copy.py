"""``agents-memory copy``: every session and item of one store into another, resumably.

The path for moving from SQLite on a laptop to Postgres in production: the
target is migrated first, then sessions stream across in batches (one
transaction each) with their original times and order. Re-running after an
interruption finishes the job without duplicating anything; see
:mod:`agents_memory._admin._transfer` for how. With ``resume`` or ``replace``,
advanced sessions' turns, usage and branch names follow their items, and the
branch names of sessions cleared in the source follow too
(:mod:`agents_memory._admin._advanced_copy`).
"""

from __future__ import annotations

from agents_memory import migrations
from agents_memory._admin._advanced_copy import carry_advanced
from agents_memory._admin._errors import AdminError
from agents_memory._admin._target import Target, open_store
from agents_memory._admin._transfer import (
    TransferResult,
    store_pages,
    transfer,
)
from agents_memory._admin._types import IfExists, NoProgress, Progress
from agents_memory._sqlalchemy._bulk import bulk_for
from agents_memory._sqlalchemy._store import backend_of


async def copy(
    source: Target,
    dest: Target,
    *,
    batch_size: int = 1000,
    if_exists: IfExists = "resume",
    progress: Progress | None = None,
) -> TransferResult:
    """Copy all of ``source`` into ``dest`` (migrated to head first)."""
    if source.same_store_as(dest):
        msg = (
            f"the source and the target are the same store ({source}); pick another --to, "
            "or other tables with --to-sessions-table/--to-messages-table"
        )
        raise AdminError(msg)
    progress = progress or NoProgress()
    async with open_store(source) as src:
        total = (await src.stats(largest=0)).items
        await migrations.upgrade(dest.url, **dest.table_kwargs)
        async with open_store(dest, must_exist=False) as dst:
            progress.start(total)
            pages = store_pages(bulk_for(src), batch_size=batch_size)
            result = await transfer(
                pages, bulk_for(dst), batch_size=batch_size, if_exists=if_exists, progress=progress
            )
            if if_exists in ("resume", "replace"):
                carried = await carry_advanced(backend_of(src), backend_of(dst))
                result.carried(carried)
            return result
