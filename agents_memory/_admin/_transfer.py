"""Moving sessions into a store, batch by batch, so that a re-run finishes what was interrupted.

Both ``copy`` (from another store) and ``import`` (from a file) feed this
writer a stream of sessions, each a row plus its items oldest first. Items are
written in batches, one transaction each, so after an interruption every
target session holds a *prefix* of its source items. That makes resuming
simple and safe: for a session the target already has, with ``resume`` (the
default) the writer checks that the target's newest item (content and time) is
the source's item at that position, skips that many source items, and appends
the rest. An item compares by what it says: a sealed item of the source (an
export's ``{"sealed": …}``) matches the target's row it was written as, and a
plaintext one matches the row an encrypting target sealed it into, as long as
the target's keyring opens them (a resumed encrypting import recognises its own
rows). A target session that is not a prefix of the source is a conflict,
reported before anything of it is written; ``skip``, ``replace`` and
``append`` are the explicit alternatives.

Memory stays bounded by one batch of items plus one page of session rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING

from agents_memory._admin._errors import ConflictError, NotFoundError
from agents_memory._admin._types import IF_EXISTS, IfExists, NoProgress, Progress
from agents_memory._codec import decode_row
from agents_memory._crypto import Keyring, envelope_key_id
from agents_memory._errors import DecryptionError, MissingKeyError
from agents_memory._sqlalchemy._bulk import (
    MAX_IDS_PER_QUERY,
    Bulk,
    ItemRecord,
    SessionRecord,
    SessionState,
    SessionWrite,
)
from agents_memory._sqlalchemy._timestamps import naive_utc

if TYPE_CHECKING:
    from agents_memory._admin._advanced_copy import Carried

PAGE_SIZE = 500
"""Session rows read (and looked up in the target) per query."""


@dataclasses.dataclass(slots=True)
class SourceSession:
    """One session to move: its row, what is known of its items, and how to stream them."""

    record: SessionRecord
    item_count: int | None
    """How many rows the source holds (``None`` when unknown before reading, as in a file)."""
    last_item: ItemRecord | None
    items: Callable[[], AsyncIterator[ItemRecord]]


@dataclasses.dataclass(slots=True)
class TransferResult:
    """What a copy or import did."""

    sessions: int = 0
    """Sessions in the source."""
    sessions_written: int = 0
    """Sessions whose row or items were written."""
    sessions_unchanged: int = 0
    """Sessions the target already held completely (or kept, with ``skip``)."""
    items_written: int = 0
    items_present: int = 0
    """Items not written because the target already held them (or kept its own, ``skip``)."""
    advanced_sessions: int = 0
    """Advanced sessions whose turns, usage and branch names were carried."""
    advanced_skipped: int = 0
    """Advanced sessions left as they were: the target's items differ in number."""
    advanced_cleared: int = 0
    """Sessions cleared in the source (no row, no items) whose used branch names were carried."""

    def carried(self, carried: Carried) -> None:
        """Count what carrying the advanced rows did (``resume`` and ``replace`` only)."""
        self.advanced_sessions = carried.sessions
        self.advanced_skipped = carried.skipped
        self.advanced_cleared = carried.cleared


def _opened(entry: ItemRecord, keyring: Keyring | None) -> dict[str, object] | None:
    """What an item says: its item, or its sealed envelope opened (``None``: cannot say)."""
    if entry.sealed is None:
        return entry.item
    if keyring is None:
        return None
    try:
        return decode_row(entry.sealed, row_id="(sealed)", on_corrupt="raise", keyring=keyring)
    except (DecryptionError, ValueError):
        return None


def _same(a: ItemRecord | None, b: ItemRecord | None, keyring: Keyring | None = None) -> bool:
    """Whether two records are the same item at the same time (sealed or not, see above)."""
    if a is None or b is None or naive_utc(a.created_at) != naive_utc(b.created_at):
        return False
    if (a.sealed is None) == (b.sealed is None):
        return a.item == b.item and a.sealed == b.sealed
    mine, theirs = _opened(a, keyring), _opened(b, keyring)
    return mine is not None and mine == theirs


def _conflict(sid: str, detail: str) -> ConflictError:
    msg = (
        f"session {sid!r} already exists in the target and {detail}, so it is not an earlier "
        "partial copy of the source; re-run with --if-exists replace to overwrite it, skip to "
        "keep it, or append to add the source's items after its own"
    )
    return ConflictError(msg)


def _keys_needed(
    sid: str, a: ItemRecord | None, b: ItemRecord | None, keyring: Keyring | None
) -> DecryptionError | None:
    """Why two records could not be compared: one is sealed and the keys cannot open it.

    A resumed import that sealed its rows, re-run without the keys, would otherwise
    call the session a content conflict (and suggest ``--if-exists replace``, which
    would overwrite good rows); what it needs is the keys. ``None``: comparable.
    """
    if a is None or b is None or (a.sealed is None) == (b.sealed is None):
        return None
    sealed = a.sealed if a.sealed is not None else b.sealed
    assert sealed is not None  # noqa: S101 - exactly one side is sealed
    key_id = envelope_key_id(sealed)
    if keyring is None:
        msg = (
            f"session {sid!r} already exists in the target, and to tell whether it is an "
            f"earlier partial copy its items encrypted under key id {key_id!r} must be "
            "opened, but this run has no keys: re-run with the keys, given as for "
            "`agents-memory keys rotate` takes them (a keys file or the environment)"
        )
        return MissingKeyError(msg, key_id=key_id)
    try:
        decode_row(sealed, row_id=f"{sid!r} (resume check)", on_corrupt="raise", keyring=keyring)
    except DecryptionError as exc:
        return exc
    except ValueError:
        return None
    return None


class Writer:
    """Batches session rows and items into one-transaction writes on the target."""

    def __init__(
        self, dest: Bulk, *, batch_size: int, if_exists: IfExists, progress: Progress
    ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            msg = f"batch size must be a positive int, got {batch_size!r}"
            raise ValueError(msg)
        if if_exists not in IF_EXISTS:
            msg = f"if_exists must be one of {', '.join(IF_EXISTS)}, got {if_exists!r}"
            raise ValueError(msg)
        self._dest = dest
        self._keyring = dest.keyring
        self._batch_size = batch_size
        self._if_exists: IfExists = if_exists
        self._progress = progress
        self._pending: list[SessionWrite] = []
        self._pending_items = 0
        self._current: SessionWrite | None = None
        self._target_items: dict[str, int] = {}
        """Items each session holds in the target as this run knows it (checked when written)."""
        self.result = TransferResult()

    async def flush(self) -> None:
        """Write the pending batch (one transaction) and report its items."""
        if not self._pending:
            return
        await self._dest.write(self._pending)
        # Only the last session of a batch can go on into the next one: keep its count only.
        last = self._pending[-1]
        before = 0 if last.replace else (last.expected_items or 0)
        self._target_items = {last.record.session_id: before + len(last.items)}
        self.result.items_written += self._pending_items
        self._progress.advance(self._pending_items)
        self._pending, self._pending_items, self._current = [], 0, None

    async def _row(self, record: SessionRecord, *, replace: bool) -> SessionWrite:
        """The session's write in the pending batch (a new one after each flush)."""
        if self._current is None or self._current.record.session_id != record.session_id:
            if len(self._pending) >= MAX_IDS_PER_QUERY:
                await self.flush()
            sid = record.session_id
            self._current = SessionWrite(
                record, replace=replace, expected_items=self._target_items.get(sid, 0)
            )
            self._pending.append(self._current)
        return self._current

    async def _item(self, record: SessionRecord, item: ItemRecord, *, replace: bool) -> None:
        (await self._row(record, replace=replace)).items.append(item)
        self._pending_items += 1
        if self._pending_items >= self._batch_size:
            await self.flush()

    def _present(self, n: int) -> None:
        self.result.items_present += n
        self._progress.advance(n)

    async def session(self, src: SourceSession, existing: SessionState | None) -> None:
        """Bring one session of the target up to its source, as ``if_exists`` says."""
        self.result.sessions += 1
        self._target_items[src.record.session_id] = 0 if existing is None else existing.item_count
        mode = self._if_exists
        if existing is None or mode == "append":
            await self._stream(src, existing, skip=0, replace=False)
        elif mode == "skip":
            await self._keep(src)
        elif mode == "replace":
            await self._stream(src, existing, skip=0, replace=True)
        elif not await self._already_complete(src, existing):
            await self._stream(src, existing, skip=existing.item_count, replace=False)

    async def _keep(self, src: SourceSession) -> None:
        """``skip``: leave the target's session as it is."""
        n = src.item_count
        if n is None:  # a file: read past this session's items
            n = 0
            async for _ in src.items():
                n += 1
        self._present(n)
        self.result.sessions_unchanged += 1

    async def _already_complete(self, src: SourceSession, existing: SessionState) -> bool:
        """``resume`` fast path: same count and same newest item, so no item needs reading."""
        n = src.item_count
        if n is None or n != existing.item_count:
            return False
        if n and not _same(src.last_item, existing.last_item, self._keyring):
            return False
        self._present(n)
        if src.record == existing.record:
            self.result.sessions_unchanged += 1
        else:  # same items, another row (metadata or times): refresh the row only
            await self._row(src.record, replace=False)
            self.result.sessions_written += 1
        return True

    async def _stream(
        self, src: SourceSession, existing: SessionState | None, *, skip: int, replace: bool
    ) -> None:
        """Read the source's items, check the first ``skip`` end where the target's do, append."""
        sid = src.record.session_id
        seen = written = 0
        async for item in src.items():
            seen += 1
            if seen <= skip:
                if (
                    seen == skip
                    and existing is not None
                    and not _same(item, existing.last_item, self._keyring)
                ):
                    needed = _keys_needed(sid, item, existing.last_item, self._keyring)
                    if needed is not None:
                        raise needed
                    raise _conflict(sid, f"its item {skip} differs from the source's")
                self._present(1)
                continue
            await self._item(src.record, item, replace=replace and written == 0)
            written += 1
        if seen < skip:
            raise _conflict(sid, f"holds {skip} items where the source has only {seen}")
        if written == 0:
            if existing is not None and not replace and src.record == existing.record:
                self.result.sessions_unchanged += 1
                return
            await self._row(src.record, replace=replace)
        self.result.sessions_written += 1


async def transfer(
    pages: AsyncIterator[Sequence[SourceSession]],
    dest: Bulk,
    *,
    batch_size: int,
    if_exists: IfExists = "resume",
    progress: Progress | None = None,
) -> TransferResult:
    """Write every source session into ``dest``; see the module docstring for the rules."""
    writer = Writer(
        dest, batch_size=batch_size, if_exists=if_exists, progress=progress or NoProgress()
    )
    try:
        async for page in pages:
            existing = await dest.states_of([src.record.session_id for src in page])
            for src in page:
                await writer.session(src, existing.get(src.record.session_id))
    except ConflictError:
        await writer.flush()  # keep what was done before the conflicting session
        raise
    await writer.flush()
    return writer.result


def _source(bulk: Bulk, state: SessionState, batch_size: int) -> SourceSession:
    sid = state.record.session_id
    return SourceSession(
        state.record,
        state.item_count,
        state.last_item,
        lambda: bulk.rows(sid, batch_size=batch_size),
    )


async def named_states(
    bulk: Bulk, session_ids: Sequence[str], where: str
) -> dict[str, SessionState]:
    """The named sessions' states, in the order named (once each); a missing one is an error.

    Looked up before anything is read or written, so a typo fails the whole command.
    """
    wanted = list(dict.fromkeys(session_ids))
    states = await bulk.states_of(wanted)
    missing = [sid for sid in wanted if sid not in states]
    if missing:
        names = ", ".join(repr(s) for s in missing)
        msg = f"no session {names} in {where}; see `agents-memory sessions list`"
        raise NotFoundError(msg)
    return {sid: states[sid] for sid in wanted}


async def named_pages(
    bulk: Bulk, states: dict[str, SessionState], *, batch_size: int
) -> AsyncIterator[list[SourceSession]]:
    """The sessions of :func:`named_states` as pages for :func:`transfer` or export."""
    chosen = list(states.values())
    for start in range(0, len(chosen), PAGE_SIZE):
        yield [_source(bulk, state, batch_size) for state in chosen[start : start + PAGE_SIZE]]


async def store_pages(bulk: Bulk, *, batch_size: int) -> AsyncIterator[list[SourceSession]]:
    """All of a store's sessions as pages for :func:`transfer` or export, in session-id order.

    A stable keyset: sessions created meanwhile are picked up by the next run
    rather than shifting pages.
    """
    after: str | None = None
    while True:
        page = await bulk.states_after(after, PAGE_SIZE)
        if not page:
            return
        yield [_source(bulk, state, batch_size) for state in page]
        after = page[-1].record.session_id
