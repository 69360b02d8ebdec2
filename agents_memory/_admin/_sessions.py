"""``agents-memory sessions …``: list, read, delete and count the sessions of one store."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING

from agents_memory._admin._errors import NotFoundError
from agents_memory._admin._target import Target, open_store
from agents_memory._admin._types import NoProgress, Progress
from agents_memory._errors import DecryptionError
from agents_memory._sqlalchemy._metadata import FilterValue
from agents_memory._sqlalchemy._prune import PruneReport
from agents_memory._sqlalchemy._prune import prune as run_prune
from agents_memory._sqlalchemy._stats import StoreStats
from agents_memory._sqlalchemy._store import (
    Order,
    SessionInfo,
    SessionPage,
    SessionStore,
    backend_of,
)

if TYPE_CHECKING:
    from agents_memory._protocol import TResponseInputItem


async def list_sessions(
    target: Target,
    *,
    limit: int = 20,
    cursor: str | None = None,
    metadata: Mapping[str, FilterValue] | None = None,
    updated_before: dt.datetime | None = None,
    order: Order = "newest",
) -> SessionPage:
    """One page of sessions by last update (pass ``next_cursor`` for the next)."""
    async with open_store(target) as store:
        return await store.list_sessions(
            limit=limit,
            cursor=cursor,
            metadata=metadata or None,
            updated_before=updated_before,
            order=order,
        )


async def prune(
    target: Target,
    *,
    older_than: dt.timedelta | None = None,
    keep_last: int | None = None,
    metadata: Mapping[str, FilterValue] | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
) -> PruneReport:
    """Apply a retention policy (``SessionStore.prune``), reporting items as they go."""
    async with open_store(target) as store:
        done = progress or NoProgress()
        done.start(None)
        return await run_prune(
            backend_of(store),
            older_than=older_than,
            keep_last=keep_last,
            metadata=metadata or None,
            dry_run=dry_run,
            progress=done.advance,
        )


async def _info(store: SessionStore, target: Target, session_id: str) -> SessionInfo:
    info = await store.get_session(session_id)
    if info is None:
        msg = (
            f"there is no session {session_id!r} in {target}; "
            "see the stored ones with `agents-memory sessions list`"
        )
        raise NotFoundError(msg)
    return info


async def get_session(target: Target, session_id: str) -> SessionInfo:
    """The listing entry of one session; :class:`NotFoundError` if it does not exist."""
    async with open_store(target) as store:
        return await _info(store, target, session_id)


@dataclasses.dataclass(frozen=True, slots=True)
class Transcript:
    """A session's entry and a stream of its items, oldest first."""

    info: SessionInfo
    first_number: int
    """1-based position of the first streamed item (> 1 when only the latest are shown)."""
    items: AsyncIterator[TResponseInputItem]


@contextlib.asynccontextmanager
async def transcript(
    target: Target, session_id: str, *, limit: int | None = None, batch_size: int = 500
) -> AsyncIterator[Transcript]:
    """Open a session for reading: all items streamed, or the latest ``limit`` of them."""
    async with open_store(target) as store:
        info = await _info(store, target, session_id)
        session = store.session(session_id)
        if limit is None:
            yield Transcript(info, 1, session.iter_items(batch_size=batch_size))
            return
        items = await session.get_items(limit=limit)

        async def stream() -> AsyncIterator[TResponseInputItem]:
            for item in items:
                yield item

        yield Transcript(info, max(1, info.item_count - len(items) + 1), stream())


async def delete_session(target: Target, session_id: str, *, force: bool = False) -> SessionInfo:
    """Delete a session and its items; returns what was deleted, or raises if it was absent.

    Encrypted items the target's keyring cannot open refuse the delete, unless ``force``.
    """
    async with open_store(target) as store:
        info = await _info(store, target, session_id)
        try:
            await store.delete_session(session_id, force=force)
        except DecryptionError as exc:
            msg = f"{exc}; nothing was deleted (--force deletes them unread)"
            raise type(exc)(msg, key_id=exc.key_id) from None
        return info


async def stats(target: Target, *, largest: int = 5) -> StoreStats:
    """Totals of the store and its ``largest`` biggest sessions."""
    async with open_store(target) as store:
        return await store.stats(largest=largest)
