"""``SessionStore``: one engine and one table-name set, handing out any number of sessions.

An app with many conversations should hold one store for its lifetime, so all
of them share one connection pool (and, on SQLite, one write queue).
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Self

from sqlalchemy import Select, bindparam, func, select, tuple_
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory._closing import AsyncClosing
from agents_memory._codec import OnCorrupt
from agents_memory._crypto import Keyring
from agents_memory._ids import validate_session_id
from agents_memory._protocol import coerce_settings
from agents_memory._sqlalchemy._backend import Backend
from agents_memory._sqlalchemy._engine import create_engine
from agents_memory._sqlalchemy._metadata import FilterValue, metadata_filter
from agents_memory._sqlalchemy._rotate import KeyRotationReport, rotate
from agents_memory._sqlalchemy._session import SQLAlchemySession
from agents_memory._sqlalchemy._stats import StoreStats, store_stats
from agents_memory._tables import DEFAULT_MESSAGES_TABLE, DEFAULT_SESSIONS_TABLE, TableNames
from agents_memory._urls import DEFAULT_URL, mask_url

if TYPE_CHECKING:
    from agents_memory._protocol import SessionSettings

MAX_PAGE_SIZE = 1000


@dataclasses.dataclass(frozen=True, slots=True)
class SessionInfo:
    """What a listing shows about one stored session."""

    session_id: str
    created_at: dt.datetime
    updated_at: dt.datetime
    item_count: int
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The session's metadata tags (see ``SQLAlchemySession.set_metadata``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class SessionPage:
    """One page of :meth:`SessionStore.list_sessions`; pass ``next_cursor`` to get the next."""

    sessions: list[SessionInfo]
    next_cursor: str | None


def _encode_cursor(info: SessionInfo) -> str:
    raw = json.dumps([info.updated_at.isoformat(), info.session_id]).encode()
    return base64.urlsafe_b64encode(raw).decode("ascii")


def _decode_cursor(cursor: str) -> tuple[dt.datetime, str]:
    try:
        stamp, session_id = json.loads(base64.urlsafe_b64decode(cursor.encode("ascii")))
        return dt.datetime.fromisoformat(stamp), str(session_id)
    except (ValueError, TypeError, UnicodeError) as exc:
        msg = "invalid cursor: pass the next_cursor of a previous page unchanged"
        raise ValueError(msg) from exc


class SessionStore(AsyncClosing):
    """Sessions over one engine and one table-name set, plus listing and deletion.

    ``encryption=Keyring(...)`` encrypts every session's items at rest (metadata
    stays plaintext, for filtering); :meth:`rotate_keys` moves them to a new key.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        sessions_table: str = DEFAULT_SESSIONS_TABLE,
        messages_table: str = DEFAULT_MESSAGES_TABLE,
        create_tables: bool = False,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        on_corrupt: OnCorrupt = "skip",
        ensure_ascii: bool = False,
        encryption: Keyring | None = None,
    ) -> None:
        names = TableNames(sessions_table, messages_table)
        self._backend = Backend(
            engine,
            names,
            create_tables=create_tables,
            on_corrupt=on_corrupt,
            encryption=encryption,
        )
        self.session_settings: SessionSettings | None = coerce_settings(session_settings)
        self.ensure_ascii = ensure_ascii

    @classmethod
    def from_url(
        cls,
        url: str | URL = DEFAULT_URL,
        *,
        engine_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,  # noqa: ANN401
    ) -> Self:
        """Create a store that owns an engine for ``url``; close it with ``close()``."""
        engine = create_engine(url, **(engine_kwargs or {}))
        self = cls(engine, **kwargs)
        self._backend.own_engine(cls.__name__)
        return self

    @property
    def engine(self) -> AsyncEngine:
        """The engine every session of this store shares."""
        return self._backend.engine

    @property
    def table_names(self) -> TableNames:
        """The validated table names of this store."""
        return self._backend.names

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(url={mask_url(self.engine.url)!r}, "
            f"tables={self._backend.names!r})"
        )

    def session(
        self,
        session_id: str,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> SQLAlchemySession:
        """A session over this store's pool; cheap, so make one per conversation or request.

        Without ``session_settings`` it gets the store's (shared, as the SDK shares one
        ``SessionSettings`` object it is given).
        """
        settings = coerce_settings(session_settings)
        return SQLAlchemySession._from_backend(  # noqa: SLF001
            session_id,
            self._backend,
            settings if settings is not None else self.session_settings,
            ensure_ascii=self.ensure_ascii,
        )

    def _listing(self) -> Select[Any]:
        """Sessions with their item counts (a correlated count per row, using the index)."""
        st = self._backend.st
        s, m = st.sessions.c, st.messages.c
        count = select(func.count()).where(m.session_id == s.session_id).scalar_subquery()
        return select(
            s.session_id, s.created_at, s.updated_at, count.label("item_count"), s["metadata"]
        )

    @staticmethod
    def _info(row: Any) -> SessionInfo:  # noqa: ANN401
        meta = row[4] if isinstance(row[4], dict) else {}
        return SessionInfo(str(row[0]), row[1], row[2], int(row[3]), meta)

    async def list_sessions(
        self,
        *,
        limit: int = 50,
        cursor: str | None = None,
        metadata: Mapping[str, FilterValue] | None = None,
    ) -> SessionPage:
        """Sessions newest-updated first, ``limit`` per page, paginated by keyset.

        Keyset pagination (not OFFSET) keeps every page equally fast and never
        repeats a session while you page. ``metadata={"user": "u1"}`` keeps only
        sessions whose metadata has each of those keys with exactly that value.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_SIZE:
            msg = f"limit must be an int from 1 to {MAX_PAGE_SIZE}, got {limit!r}"
            raise ValueError(msg)
        s = self._backend.st.sessions.c
        query = self._listing().order_by(s.updated_at.desc(), s.session_id.desc()).limit(limit + 1)
        if metadata is not None:
            sessions = self._backend.st.sessions
            query = query.where(metadata_filter(self._backend.db, sessions, metadata))
        if cursor is not None:
            stamp, after_id = _decode_cursor(cursor)
            db = self._backend.db  # the time as the column holds it (SQLite: its own text)
            stamp_param = bindparam(
                "after_stamp", db.stamp(stamp), type_=db.stamp_type(s.updated_at.type)
            )
            query = query.where(tuple_(s.updated_at, s.session_id) < tuple_(stamp_param, after_id))
        rows = await self._backend.fetch(query)
        infos = [self._info(r) for r in rows[:limit]]
        next_cursor = _encode_cursor(infos[-1]) if len(rows) > limit else None
        return SessionPage(infos, next_cursor)

    async def get_session(self, session_id: str) -> SessionInfo | None:
        """The listing entry of one session, or ``None`` if it does not exist."""
        s = self._backend.st.sessions.c
        query = self._listing().where(s.session_id == validate_session_id(session_id))
        rows = await self._backend.fetch(query)
        return self._info(rows[0]) if rows else None

    async def delete_session(self, session_id: str, *, force: bool = False) -> bool:
        """Delete a session and all its items; ``True`` if it existed.

        A session holding encrypted items this store's keyring cannot open (or any,
        without a keyring) is refused with :class:`~agents_memory.DecryptionError`
        and left whole; ``force=True`` deletes it anyway (a key that is lost for good).
        """
        return await self._backend.clear(validate_session_id(session_id), force=force)

    @property
    def encryption(self) -> Keyring | None:
        """The keyring items are encrypted with (``None``: stored as plaintext JSON)."""
        return self._backend.keyring

    async def rotate_keys(
        self,
        to: str,
        *,
        batch_size: int = 500,
        dry_run: bool = False,
        progress: Callable[[int], None] | None = None,
    ) -> KeyRotationReport:
        """Re-encrypt every item not under key ``to`` (plaintext items too), in short batches.

        Safe while the application writes (a row changed since it was read is left
        alone), resumable after any interruption (run it again), and never
        encrypts twice. ``dry_run`` only counts the items left. ``progress`` is
        called with the number of rows each batch examined.
        """
        return await rotate(
            self._backend, to, batch_size=batch_size, dry_run=dry_run, progress=progress
        )

    async def stats(self, *, largest: int = 5) -> StoreStats:
        """Totals for the store: sessions, items, time span and the ``largest`` biggest sessions."""
        return await store_stats(self._backend, largest=largest)

    async def close(self) -> None:
        """Dispose the engine if the store created it (``from_url``); sessions then raise."""
        await self._backend.close()
