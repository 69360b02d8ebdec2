"""Bulk reads and writes that carry their own timestamps: the path behind copy, export and import.

``add_items`` stamps rows with the database's clock, which is right for a live
conversation. Moving a store elsewhere must keep every session's and item's
original times and order instead, so this path reads rows together with their
times and writes them back explicitly. Every record is validated (the same id,
JSON and metadata rules as the protocol) before the first statement runs, and
each batch is one transaction: an interrupted copy leaves whole batches only.

The SQL is portable Core (select, then update or insert), so it needs no
dialect-specific upsert. Two copies or imports into one target may overlap: each
batch takes the target table set's lock (the migration lock: a transaction-scoped
advisory lock on Postgres, ``GET_LOCK`` on MySQL, the write lock on SQLite) and,
under it, checks that each session still holds the number of items the writer
expects; a session another writer changed meanwhile fails the batch
(:class:`ConcurrentWriteError`) before anything of it is written, so no item is
ever stored twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
from collections.abc import AsyncIterator, Sequence
from typing import Any, cast

from sqlalchemy import (
    Delete,
    Insert,
    Select,
    Table,
    Update,
    bindparam,
    delete,
    func,
    insert,
    null,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection
from sqlalchemy.types import TypeEngine

from agents_memory._codec import OnCorrupt, decode_row, encode_stored_item
from agents_memory._crypto import Keyring, is_envelope
from agents_memory._databases.base import order_key, tables_for
from agents_memory._errors import AgentsMemoryError
from agents_memory._ids import check_sql_int, validate_session_id
from agents_memory._migrations._runner import lock as table_set_lock
from agents_memory._sqlalchemy._backend import Backend
from agents_memory._sqlalchemy._metadata import validate_metadata
from agents_memory._sqlalchemy._store import SessionStore
from agents_memory._sqlalchemy._timestamps import naive_utc, utcnow
from agents_memory._tables import TableNames
from agents_memory.models import get_models

MAX_IDS_PER_QUERY = 1000
"""Most session ids one ``IN (...)`` carries; far below every backend's parameter limit."""


class ConcurrentWriteError(AgentsMemoryError):
    """Another writer changed a session of the batch between the read and the write."""


@dataclasses.dataclass(frozen=True, slots=True)
class SessionRecord:
    """A session's own row: what a copy carries besides the items."""

    session_id: str
    created_at: dt.datetime
    updated_at: dt.datetime
    metadata: dict[str, Any] | None = None
    expires_at: dt.datetime | None = None
    """The session's deadline (naive UTC), carried so that it survives a move."""

    def validated(self) -> SessionRecord:
        """The same record with every field checked; a typed error names the session."""
        try:
            session_id = validate_session_id(self.session_id)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"session {self.session_id!r}: {exc}") from None
        try:
            return SessionRecord(
                session_id,
                naive_utc(self.created_at, what="created_at"),
                naive_utc(self.updated_at, what="updated_at"),
                None if self.metadata is None else validate_metadata(self.metadata),
                None if self.expires_at is None else naive_utc(self.expires_at, what="expires_at"),
            )
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"session {session_id!r}: {exc}") from None


@dataclasses.dataclass(frozen=True, slots=True)
class ItemRecord:
    """One stored item and the time it was written."""

    item: dict[str, Any]
    created_at: dt.datetime
    sealed: str | None = None
    """An encrypted row read without its key: the envelope, carried unchanged (``item`` is
    then ``{}``). A copy or export of an encrypted store needs no key; the row is written
    back exactly as it was stored."""


@dataclasses.dataclass(frozen=True, slots=True)
class SessionState:
    """A stored session as a copy sees it: its row, its item count and its newest item."""

    record: SessionRecord
    item_count: int
    last_item: ItemRecord | None
    """The newest row decoded (``None`` when empty, or when that row is not valid JSON)."""


@dataclasses.dataclass(slots=True)
class SessionWrite:
    """One session's part of a batch: its row (always written) and items appended after."""

    record: SessionRecord
    items: list[ItemRecord] = dataclasses.field(default_factory=list)
    replace: bool = False
    """Delete the session's existing items first (in the same transaction)."""
    expected_items: int | None = None
    """How many items the writer believes the target holds for this session before the write;
    checked under the target's lock (``None``: not checked)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Statements:
    states: Select[Any]
    last_rows: Select[Any]
    rows_after: Select[Any]
    existing: Select[Any]
    counters: Select[Any] | None
    """Head: each session's ``last_position`` (read after the batch's writes moved it)."""
    counts: Select[Any]
    insert_session: Insert
    update_session: Update
    insert_message: Insert
    delete_messages: Delete
    delete_sessions: Delete
    expired: Select[Any] | None
    """The batch's sessions whose deadline has passed (``None``: no ``expires_at``)."""


@functools.cache
def _statements(names: TableNames, db: Any, expiry: bool = False) -> _Statements:  # noqa: ANN401
    """The bulk statements (``db``: the ``Database`` class); ``expiry``: tables at head.

    With ``expiry`` the reads leave out expired sessions (bound ``now``, the client
    clock, as ``list_sessions`` compares) and carry ``expires_at``; the writes set it.
    """
    s: Table = get_models(names).Session.__table__
    m: Table = tables_for(names, expiry)[1]  # (legacy tables: items keyed by id)
    key = order_key(m)
    # Times are bound as the database's column takes them (SQLite: its own text format).
    stamp: TypeEngine[Any] = db.stamp_type(s.c.created_at.type)
    ids: Any = bindparam("ids", expanding=True)
    count = select(func.count()).where(m.c.session_id == s.c.session_id).scalar_subquery()
    last_id = select(func.max(key)).where(m.c.session_id == s.c.session_id).scalar_subquery()
    row = {
        "created_at": bindparam("b_created", type_=stamp),
        "updated_at": bindparam("b_updated", type_=stamp),
        "metadata": bindparam("b_meta", type_=s.c["metadata"].type),
    }
    states = select(s.c.session_id, s.c.created_at, s.c.updated_at, s.c["metadata"], count, last_id)
    expired = None
    counter_set: dict[str, Any] = {}
    counter_bump: dict[str, Any] = {}
    if expiry:
        # Each batch takes the positions after the session's counter (the rows are locked
        # by the table set's lock and the upserts) and moves the counter past them.
        taken = bindparam("b_n", type_=s.c.last_position.type)
        counter_set["last_position"] = taken
        counter_bump["last_position"] = s.c.last_position + taken
        now = bindparam("now", type_=db.stamp_type(s.c.expires_at.type))
        row["expires_at"] = bindparam("b_expires", type_=db.stamp_type(s.c.expires_at.type))
        states = states.add_columns(s.c.expires_at).where(
            or_(s.c.expires_at.is_(None), s.c.expires_at > now)
        )
        expired = select(s.c.session_id).where(s.c.session_id.in_(ids), s.c.expires_at <= now)
    return _Statements(
        states=states,
        last_rows=select(m.c.session_id, key, m.c.message_data, m.c.created_at).where(
            tuple_(m.c.session_id, key).in_(bindparam("keys", expanding=True))
        ),
        rows_after=select(key, m.c.message_data, m.c.created_at)
        .where(m.c.session_id == bindparam("sid"), key > bindparam("after"))
        .order_by(key)
        .limit(bindparam("n")),
        existing=select(s.c.session_id).where(s.c.session_id.in_(ids)),
        counters=None
        if not expiry
        else select(s.c.session_id, s.c.last_position).where(s.c.session_id.in_(ids)),
        counts=select(m.c.session_id, func.count())
        .where(m.c.session_id.in_(ids))
        .group_by(m.c.session_id),
        insert_session=insert(s).values(session_id=bindparam("b_sid"), **row, **counter_set),
        update_session=update(s)
        .where(s.c.session_id == bindparam("b_sid"))
        .values(**row, **counter_bump),
        insert_message=insert(m).values(
            session_id=bindparam("b_sid"),
            message_data=bindparam("b_data"),
            created_at=bindparam("b_created", type_=stamp),
            **({"position": bindparam("b_pos", type_=m.c.position.type)} if expiry else {}),
        ),
        delete_messages=delete(m).where(m.c.session_id.in_(ids)),
        delete_sessions=delete(s).where(s.c.session_id.in_(ids)),
        expired=expired,
    )


def _stored_form(entry: ItemRecord, index: int, keyring: Keyring | None) -> str:
    """What a record is stored as: a sealed one as it came, else encoded (and encrypted)."""
    if entry.sealed is not None:
        if not is_envelope(entry.sealed):
            msg = f"item {index}: 'sealed' is not an encrypted envelope"
            raise ValueError(msg)
        return entry.sealed
    data = encode_stored_item(entry.item, index=index)
    return data if keyring is None else keyring.encrypt(data)


class Bulk:
    """Timestamp-preserving reads and batched writes for one store's backend."""

    def __init__(self, backend: Backend, *, on_corrupt: OnCorrupt = "skip") -> None:
        self._backend = backend
        self._on_corrupt: OnCorrupt = on_corrupt
        self._stamp = backend.db.stamp

    @property
    def _st(self) -> _Statements:
        """The statements for the tables as the schema check found them (read after it)."""
        backend = self._backend
        return _statements(backend.names, cast("Any", backend.db), backend.expiry)

    async def _prepared(self) -> _Statements:
        """:attr:`_st` once the schema check has said whether the tables have ``expires_at``."""
        await self._backend.statements()
        return self._st

    def _now(self) -> dict[str, Any]:
        """``now`` for the expiry statements: the client clock, as ``list_sessions`` binds it."""
        return {"now": self._stamp(utcnow())}

    @property
    def keyring(self) -> Keyring | None:
        """The store's keyring: what it seals plaintext items with and opens rows with."""
        return self._backend.keyring

    # -- reads --------------------------------------------------------------------------------

    async def states_after(self, after: str | None, limit: int) -> list[SessionState]:
        """Up to ``limit`` sessions in session-id order after ``after``: a stable keyset walk."""
        s = self._backend.st.sessions.c
        query = (await self._prepared()).states.order_by(s.session_id).limit(limit)
        if after is not None:
            query = query.where(s.session_id > after)
        return await self._states(query)

    async def states_of(self, session_ids: Sequence[str]) -> dict[str, SessionState]:
        """The state of each of ``session_ids`` that exists (absent ids are left out)."""
        out: dict[str, SessionState] = {}
        s = self._backend.st.sessions.c
        await self._prepared()
        for start in range(0, len(session_ids), MAX_IDS_PER_QUERY):
            chunk = list(session_ids[start : start + MAX_IDS_PER_QUERY])
            query = self._st.states.where(s.session_id.in_(chunk))
            out.update((st.record.session_id, st) for st in await self._states(query))
        return out

    async def _states(self, query: Select[Any]) -> list[SessionState]:
        async with self._backend.reading() as conn:
            heads = (await conn.execute(query, self._now())).all()
            keys = [(h[0], int(h[5])) for h in heads if h[5] is not None]
            lasts = {}
            if keys:
                rows = (await conn.execute(self._st.last_rows, {"keys": keys})).all()
                lasts = {(r[0], int(r[1])): r for r in rows}
        states = []
        for sid, created, updated, meta, count, last_id, *expires in heads:
            last = None
            row = lasts.get((sid, int(last_id))) if last_id is not None else None
            if row is not None:
                last = self._record(row[1], row[2], row[3])
            meta_ = meta if isinstance(meta, dict) else None
            record = SessionRecord(sid, created, updated, meta_, expires[0] if expires else None)
            states.append(SessionState(record, int(count), last))
        return states

    def _record(self, row_id: object, data: object, created: dt.datetime) -> ItemRecord | None:
        """One row as a record: decoded (and decrypted, with a keyring), or sealed as stored."""
        keyring = self._backend.keyring
        if keyring is None and is_envelope(data):
            return ItemRecord({}, created, sealed=str(data))
        item = decode_row(data, row_id=row_id, on_corrupt=self._on_corrupt, keyring=keyring)
        return None if item is None else ItemRecord(item, created)

    async def rows(self, session_id: str, *, batch_size: int) -> AsyncIterator[ItemRecord]:
        """Every item of a session with its time, oldest first, ``batch_size`` rows per read."""
        if batch_size < 1:
            msg = f"batch_size must be >= 1, got {batch_size}"
            raise ValueError(msg)
        check_sql_int("batch_size", batch_size)
        after = -1
        while True:
            params = {"sid": session_id, "after": after, "n": batch_size}
            async with self._backend.reading() as conn:
                rows = (await conn.execute(self._st.rows_after, params)).all()
            for row_id, data, created in rows:
                record = self._record(row_id, data, created)
                if record is not None:
                    yield record
            if len(rows) < batch_size:
                return
            after = int(rows[-1][0])

    # -- writes -------------------------------------------------------------------------------

    def _params(
        self, writes: Sequence[SessionWrite]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
        """Validate and encode a whole batch before any statement runs."""
        sessions: list[dict[str, Any]] = []
        messages: list[dict[str, Any]] = []
        replaced: list[str] = []
        seen: set[str] = set()
        for write in writes:
            record = write.record.validated()
            sid = record.session_id
            if sid in seen:
                msg = f"session {sid!r} appears twice in one batch; give it one SessionWrite"
                raise ValueError(msg)
            seen.add(sid)
            sessions.append(
                {
                    "b_sid": sid,
                    "b_created": self._stamp(record.created_at),
                    "b_updated": self._stamp(record.updated_at),
                    "b_meta": null() if record.metadata is None else record.metadata,
                    "b_expires": self._deadline(record.expires_at),
                }
            )
            if write.replace:
                replaced.append(sid)
            keyring = self._backend.keyring
            for index, entry in enumerate(write.items):
                try:
                    data = _stored_form(entry, index, keyring)
                    created = naive_utc(entry.created_at, what=f"item {index} created_at")
                except (TypeError, ValueError) as exc:
                    raise type(exc)(f"session {sid!r}: {exc}") from None
                messages.append({"b_sid": sid, "b_data": data, "b_created": self._stamp(created)})
        return sessions, messages, replaced

    def _deadline(self, carried: dt.datetime | None) -> object:
        """A written session's deadline: the target store's ``ttl``, else the one it carries.

        The ``ttl`` because a copy is a write (every write renews it). One that has
        passed stays: the session arrives expired (empty to every read, deleted by the
        next prune), never brought back by the ``ttl``.
        """
        if carried is not None and carried <= utcnow():
            return self._stamp(carried)
        if self._backend.ttl is not None:
            return self._backend.deadline()
        return None if carried is None else self._stamp(carried)

    async def write(self, writes: Sequence[SessionWrite]) -> None:
        """Write a batch in one transaction: session rows as given, then items in order.

        An existing session's row takes the given times and metadata; its items
        are kept (and the new ones appended after them) unless ``replace`` is set.
        """
        if not writes:
            return
        if len(writes) > MAX_IDS_PER_QUERY:
            msg = f"at most {MAX_IDS_PER_QUERY} sessions per batch, got {len(writes)}"
            raise ValueError(msg)
        sessions, messages, replaced = self._params(writes)
        names = self._backend.names
        held = contextlib.ExitStack()
        # The lock is taken first in the transaction and let go only after the commit
        # (MySQL's GET_LOCK outlives transactions): the next writer's check sees this batch.
        async with self._backend.committing() as conn:
            await conn.run_sync(lambda sync: held.enter_context(table_set_lock(sync, names)))
            failed = True
            try:
                await self._check_sizes(conn, messages)
                await self._drop_expired(conn, [p["b_sid"] for p in sessions])
                await self._check_expected(conn, writes)
                await self._write_locked(conn, sessions, messages, replaced)
                await conn.commit()
                failed = False
            finally:
                try:
                    await conn.run_sync(lambda _sync: held.close())
                except Exception:
                    # The batch's own error comes first; a connection that broke with it is
                    # discarded, and the server lets go of a lock its connection held.
                    if not failed:
                        raise

    async def _check_sizes(self, conn: AsyncConnection, messages: list[dict[str, Any]]) -> None:
        """The database's item size limit (MySQL's packet), named as ``add_items`` names it."""
        db, st = self._backend.db, self._backend.st
        try:
            await db.check_item_sizes(conn, st, [m["b_data"] for m in messages])
        except ValueError:
            # find the session and its item number for the message (the error path only)
            by_session: dict[str, list[str]] = {}
            for m in messages:
                by_session.setdefault(m["b_sid"], []).append(m["b_data"])
            for sid, data in by_session.items():
                try:
                    await db.check_item_sizes(conn, st, data)
                except ValueError as exc:
                    raise ValueError(
                        f"session {sid!r}: {exc}; nothing of this batch was written"
                    ) from None
            raise

    async def _drop_expired(self, conn: AsyncConnection, ids: list[str]) -> None:
        """The batch's target sessions that have expired go first, rows and all.

        They read as absent (``states_of`` leaves them out), so the batch writes them
        afresh; the session row's delete cascades to what advanced sessions keep.
        """
        probe = self._st.expired
        if probe is None:
            return
        gone = list((await conn.execute(probe, {"ids": ids, **self._now()})).scalars())
        if gone:
            await conn.execute(self._st.delete_messages, {"ids": gone})
            await conn.execute(self._st.delete_sessions, {"ids": gone})

    async def _check_expected(self, conn: AsyncConnection, writes: Sequence[SessionWrite]) -> None:
        """Refuse the batch if a session's item count is not what the writer read."""
        checked = {w.record.session_id: w.expected_items for w in writes}
        checked = {sid: n for sid, n in checked.items() if n is not None}
        if not checked:
            return
        rows = (await conn.execute(self._st.counts, {"ids": list(checked)})).all()
        counts = {sid: int(n) for sid, n in rows}
        changed = [sid for sid, n in checked.items() if counts.get(sid, 0) != n]
        if changed:
            sid = changed[0]
            msg = (
                f"session {sid!r} in the target changed while this run was writing it "
                f"(it holds {counts.get(sid, 0)} items, {checked[sid]} expected): another "
                "copy or import is writing into the same tables; nothing of this batch was "
                "written. Let the other run finish, then run this one again (with "
                "--if-exists resume it continues where the target is)"
            )
            raise ConcurrentWriteError(msg)

    async def _write_locked(
        self,
        conn: AsyncConnection,
        sessions: list[dict[str, Any]],
        messages: list[dict[str, Any]],
        replaced: list[str],
    ) -> None:
        st = self._st
        if replaced:
            await conn.execute(st.delete_messages, {"ids": replaced})
        ids = [p["b_sid"] for p in sessions]
        existing = set((await conn.execute(st.existing, {"ids": ids})).scalars())
        taken: dict[str, int] = {}
        for p in messages:  # the k-th item of a session in this batch
            p["b_pos"] = taken[p["b_sid"]] = taken.get(p["b_sid"], 0) + 1
        for p in sessions:
            p["b_n"] = taken.get(p["b_sid"], 0)
        updates = [p for p in sessions if p["b_sid"] in existing]
        inserts = [p for p in sessions if p["b_sid"] not in existing]
        if updates:
            await conn.execute(st.update_session, updates)
        if inserts:
            await conn.execute(st.insert_session, inserts)
        if messages and st.counters is not None and taken:
            # The rows are locked by the writes above, which moved each counter past this
            # batch: its items take the positions just below the counter, in order.
            counters = await conn.execute(st.counters, {"ids": list(taken)})
            tops: dict[str, int] = dict(counters.all())  # (rows of two: id, counter)
            for p in messages:
                p["b_pos"] += int(tops[p["b_sid"]]) - taken[p["b_sid"]]
        if messages:
            await conn.execute(st.insert_message, messages)


def bulk_for(store: SessionStore, *, on_corrupt: OnCorrupt = "skip") -> Bulk:
    """The bulk path over a store's own backend (its engine, names and write lock)."""
    return Bulk(store._backend, on_corrupt=on_corrupt)  # noqa: SLF001 - same package
