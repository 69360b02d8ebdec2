"""``SQLAlchemySession``: the Agents SDK's class of the same name, on our backend."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, Self

from sqlalchemy import bindparam, delete, select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory._closing import AsyncClosing
from agents_memory._codec import OnCorrupt, encode_items
from agents_memory._crypto import Keyring
from agents_memory._databases.base import check_heads, heads_where
from agents_memory._errors import SessionClosedError
from agents_memory._ids import validate_session_id
from agents_memory._protocol import (
    SessionBase,
    coerce_settings,
    resolve_limit,
    writes_overridden,
)
from agents_memory._sqlalchemy._backend import Backend
from agents_memory._sqlalchemy._compaction import CompactionSnapshot, declined, snapshot
from agents_memory._sqlalchemy._engine import create_engine
from agents_memory._sqlalchemy._metadata import get_metadata_statement, validate_metadata
from agents_memory._sqlalchemy._timestamps import utcnow
from agents_memory._tables import DEFAULT_MESSAGES_TABLE, DEFAULT_SESSIONS_TABLE, TableNames
from agents_memory._urls import mask_url

if TYPE_CHECKING:
    from agents_memory._protocol import SessionSettings, TResponseInputItem


class SQLAlchemySession(AsyncClosing, SessionBase):
    """One conversation's history in SQLite, Postgres or MySQL, through an async SQLAlchemy engine.

    Pass ``engine=`` to share your application's engine (the session never closes
    it), or use :meth:`from_url` to let the session own one. For many
    conversations, prefer :class:`~agents_memory.SessionStore`, which hands out
    sessions over one connection pool. ``encryption=Keyring(...)`` encrypts items
    before they are written and opens them on read (see :class:`~agents_memory.Keyring`).
    ``ttl=timedelta(...)``: each write moves the session's deadline to that long
    from now; once it passes, the session reads as empty and the next write
    starts it afresh (see :meth:`set_ttl`).
    """

    def __init__(
        self,
        session_id: str,
        *,
        engine: AsyncEngine,
        create_tables: bool = False,
        sessions_table: str = DEFAULT_SESSIONS_TABLE,
        messages_table: str = DEFAULT_MESSAGES_TABLE,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        ensure_ascii: bool = False,
        on_corrupt: OnCorrupt = "skip",
        encryption: Keyring | None = None,
        ttl: dt.timedelta | None = None,
    ) -> None:
        names = TableNames(sessions_table, messages_table)
        settings = coerce_settings(session_settings)
        backend = Backend(
            engine,
            names,
            create_tables=create_tables,
            on_corrupt=on_corrupt,
            encryption=encryption,
            ttl=ttl,
        )
        self._init(session_id, backend, settings, owns_backend=True, ensure_ascii=ensure_ascii)

    def _init(
        self,
        session_id: str,
        backend: Backend,
        session_settings: SessionSettings | None,
        *,
        owns_backend: bool,
        ensure_ascii: bool,
    ) -> None:
        self.session_id: str = validate_session_id(session_id)
        self.session_settings: SessionSettings | None = session_settings
        self._ensure_ascii = ensure_ascii
        self._backend = backend
        self._owns_backend = owns_backend
        self._closed = False

    def _live(self) -> Backend:
        if self._closed:
            msg = f"session {self.session_id!r} was closed; create a new one to keep using it"
            raise SessionClosedError(msg)
        return self._backend

    @classmethod
    def _from_backend(
        cls,
        session_id: str,
        backend: Backend,
        session_settings: SessionSettings | None,
        *,
        ensure_ascii: bool,
    ) -> Self:
        """Make a session over an existing backend (the store's), skipping engine setup."""
        self = cls.__new__(cls)
        self._init(
            session_id, backend, session_settings, owns_backend=False, ensure_ascii=ensure_ascii
        )
        return self

    @classmethod
    def from_url(
        cls,
        session_id: str,
        *,
        url: str | URL,
        engine_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,  # noqa: ANN401
    ) -> Self:
        """Create a session that owns an engine for ``url``; close it with ``close()``.

        Plain ``sqlite:///``, ``postgresql://``, ``postgres://``, ``mysql://`` and
        ``mariadb://`` URLs are mapped to the async drivers.
        """
        engine = create_engine(url, **(engine_kwargs or {}))
        self = cls(session_id, engine=engine, **kwargs)
        self._backend.own_engine(f"{cls.__name__} {session_id!r}")
        return self

    @property
    def engine(self) -> AsyncEngine:
        """The engine this session runs on."""
        return self._backend.engine

    @property
    def table_names(self) -> TableNames:
        """The validated table names this session reads and writes."""
        return self._backend.names

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(session_id={self.session_id!r}, "
            f"url={mask_url(self.engine.url)!r}, tables={self._backend.names!r})"
        )

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """Return the latest ``limit`` items (all when ``None``) in chronological order.

        Without an explicit limit, ``session_settings.limit`` applies.
        """
        n = resolve_limit(limit, self.session_settings)
        return await self._live().get(self.session_id, n)  # type: ignore[return-value]

    async def iter_items(self, *, batch_size: int = 500) -> AsyncIterator[TResponseInputItem]:
        """Yield every item oldest first, reading ``batch_size`` rows at a time.

        Memory stays bounded by the batch, however long the conversation; each
        batch is its own short read, so a stream interleaved with writes sees
        items appended before it reaches the end.
        """
        async for item in self._live().iterate(self.session_id, batch_size):
            yield item  # type: ignore[misc]

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` in order, atomically: all of them or (on any error) none.

        Every item is validated and encoded first; one that is not a
        JSON-serialisable dict raises ``TypeError`` before anything is written.
        """
        data = encode_items(items, ensure_ascii=self._ensure_ascii)
        await self._live().add(self.session_id, data)

    async def pop_item(self) -> TResponseInputItem | None:
        """Atomically remove and return the newest item; ``None`` when the session is empty."""
        return await self._live().pop(self.session_id)  # type: ignore[return-value]

    async def clear_session(self) -> None:
        """Delete the session and all of its items."""
        await self._live().clear(self.session_id)

    async def replace_items(self, items: list[TResponseInputItem]) -> None:
        """Replace the whole history with ``items``, atomically: the old history or the new.

        For compaction, edits and redaction. Every item is validated and encoded
        first (a bad one raises ``TypeError``/``ValueError`` and nothing changes);
        then one transaction deletes the session's items and inserts ``items`` in
        order, so a reader, a cancel, a lost connection or a killed process sees
        the old history or the new one, never an empty or partial one. The session
        row stays (its metadata and ``created_at`` kept, ``updated_at`` bumped),
        created if missing; ``replace_items([])`` empties the history but keeps it.
        """
        data = encode_items(items, ensure_ascii=self._ensure_ascii)
        await self._live().replace(self.session_id, data)

    async def _atomic_replace_items(self, items: list[TResponseInputItem]) -> bool:
        """The Agents SDK's compaction hook: ``OpenAIResponsesCompactionSession`` calls it.

        The SDK's wrapper looks this method up on the wrapped session's type and,
        when present, swaps the history through it instead of ``clear_session`` then
        ``add_items`` (two transactions, with a window in which the history is empty).
        ``False`` (the SDK then falls back to clear-then-add) for a subclass that
        overrides how items are written but not ``replace_items``, as the SDK's own
        sessions do: an inherited swap must not bypass the subclass's transformation
        or the structures it keeps beside the items.
        """
        if writes_overridden(type(self), SQLAlchemySession):
            return False
        await self.replace_items(items)
        return True

    async def _get_compaction_snapshot(
        self, limit: int, *, prune_prefix: Callable[[Any], bool] | None = None
    ) -> CompactionSnapshot | None:
        """The Agents SDK's partial-compaction hook (0.24): the newest ``limit`` items and a swap.

        The ``Runner``'s automatic compaction reads only the latest exchange and
        swaps only the compacted suffix: one transaction that first checks the
        suffix is unchanged (``False`` and nothing changed when an append, pop,
        clear or replace came between). ``None`` for a subclass that changes how
        items are read or written, and when a row cannot be decoded (see ``_compaction``).
        """
        backend = self._live()
        if declined(type(self), SQLAlchemySession):
            return None
        return await snapshot(
            backend, self.session_id, limit, prune_prefix, ensure_ascii=self._ensure_ascii
        )

    async def get_metadata(self) -> dict[str, Any]:
        """The session's metadata tags (``{}`` when none were set or the session is new)."""
        backend = self._live()
        statement = get_metadata_statement(backend.st.sessions)
        async with backend.reading() as conn:
            value = (await conn.execute(statement, {"sid": self.session_id})).scalar()
        return dict(value) if isinstance(value, dict) else {}

    async def set_metadata(self, metadata: dict[str, Any]) -> None:
        """Replace this session's metadata (creating the session if needed).

        Tag conversations (user, channel, topic…) and find them again with
        ``SessionStore.list_sessions(metadata={...})``. The dict follows the same
        JSON rule as items: anything that would not round-trip is a ``TypeError``
        or ``ValueError`` before anything is written.
        """
        backend = self._live()
        value = validate_metadata(metadata)
        statement = backend.db.upsert_metadata(backend.st.sessions)
        params = {"sid": self.session_id, "meta": value, **backend.db.metadata_params()}
        async with backend.transaction() as conn:
            await conn.execute(statement, params)

    async def set_ttl(self, ttl: dt.timedelta | None) -> None:
        """Make this session expire ``ttl`` from now (``None``: never), creating it if needed.

        The expiry is a deadline, stored on the session row (``expires_at``): an
        expired session reads as empty (``get_items`` is ``[]``, ``pop_item``
        ``None``), is left out of ``SessionStore.list_sessions``, is started afresh
        by its next write and deleted by the next ``SessionStore.prune()``. Setting
        it does not count as a write (``updated_at`` is unchanged); call again to
        move the deadline. A store's ``ttl=`` sets it on every write instead. On a
        session that has already expired, its old items are deleted first (in the
        same transaction): a new deadline never brings them back.
        """
        if ttl is not None and (not isinstance(ttl, dt.timedelta) or ttl <= dt.timedelta(0)):
            msg = f"ttl must be a positive datetime.timedelta or None, got {ttl!r}"
            raise ValueError(msg)
        backend = self._live()
        db = backend.db
        now = utcnow()
        expires = None if ttl is None else db.stamp(now + ttl)
        statement = db.upsert_expiry(backend.st.sessions)
        params = {"sid": self.session_id, "expires": expires, **db.metadata_params()}
        s, m = backend.st.sessions, backend.st.messages
        sid = bindparam("sid", type_=s.c.session_id.type)
        at = bindparam("checked_at", db.stamp(now), type_=db.stamp_type(s.c.expires_at.type))
        # Locked first (as appends and prunes lock it), so the three never wait in a cycle.
        passed = select(s.c.expires_at <= at).where(s.c.session_id == sid).with_for_update()
        async with backend.transaction() as conn:
            if (await conn.execute(passed, params)).scalar():
                # An expired session reads as empty: a new deadline must not bring its old
                # items back, so they go now (as a write to it would delete them), checked
                # against the keyring first as every delete of items is.
                mine = m.c.session_id == sid
                check_heads(
                    (await conn.execute(heads_where(m, mine), params)).all(), backend.keyring
                )
                await conn.execute(delete(m).where(mine), params)
            await conn.execute(statement, params)

    async def expires_at(self) -> dt.datetime | None:
        """When this session expires (naive UTC), or ``None``: never, or no such session."""
        backend = self._live()
        s = backend.st.sessions
        statement = select(s.c.expires_at).where(
            s.c.session_id == bindparam("sid", type_=s.c.session_id.type)
        )
        async with backend.reading() as conn:
            value = (await conn.execute(statement, {"sid": self.session_id})).scalar()
        return value if isinstance(value, dt.datetime) else None

    async def close(self) -> None:
        """Close this session; dispose the engine too if the session created it (``from_url``).

        An engine passed in, or a store's, is left open for its owner to close.
        """
        self._closed = True
        if self._owns_backend:
            await self._backend.close()
