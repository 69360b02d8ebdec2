"""``agents-memory keys rotate``: re-encrypt a store's items under one key (work in the store)."""

from __future__ import annotations

from agents_memory._admin._target import Target, open_store
from agents_memory._admin._types import NoProgress, Progress
from agents_memory._sqlalchemy._rotate import KeyRotationReport


async def rotate_keys(
    target: Target,
    to: str,
    *,
    batch_size: int = 500,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> KeyRotationReport:
    """Rotate ``target`` (opened with its keyring) to key ``to``; ``dry_run`` only counts."""
    progress = progress or NoProgress()
    async with open_store(target) as store:
        if not dry_run:
            before = await store.rotate_keys(to, dry_run=True)
            progress.start(before.remaining)
        return await store.rotate_keys(
            to, batch_size=batch_size, dry_run=dry_run, progress=progress.advance
        )
