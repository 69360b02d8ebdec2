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
from typing import TYPE_CHECKING, Any, Literal, Self

from sqlalchemy import Select, bindparam, delete, exists, func, or_, select, tuple_
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory._closing import AsyncClosing
from agents_memory._codec import OnCorrupt
from agents_memory._crypto import Keyring
from agents_memory._ids import MAX_PAGE_SIZE, check_sql_int, validate_session_id
from agents_memory._protocol import coerce_settings
from agents_memory._sqlalchemy._advanced import AdvancedSQLAlchemySession
from agents_memory._sqlalchemy._backend import Backend
from agents_memory._sqlalchemy._engine import create_engine
from agents_memory._sqlalchemy._metadata import FilterValue, metadata_filter
from agents_memory._sqlalchemy._prune import PruneReport, prune
from agents_memory._sqlalchemy._rotate import KeyRotationReport, rotate
from agents_memory._sqlalchemy._session import SQLAlchemySession
from agents_memory._sqlalchemy._stats import StoreStats, store_stats
from agents_memory._sqlalchemy._timestamps import utcnow
from agents_memory._tables import DEFAULT_MESSAGES_TABLE, DEFAULT_SESSIONS_TABLE, TableNames
from agents_memory._urls import DEFAULT_URL, mask_url
from agents_memory.models import get_models

if TYPE_CHECKING:
    from agents_memory._protocol import SessionSettings


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


Order = Literal["newest", "oldest"]
"""Listing order by last update: ``newest`` first (the default) or ``oldest`` first."""


def _encode_cursor(info: SessionInfo, order: Order = "newest") -> str:
    position: list[str] = [info.updated_at.isoformat(), info.session_id]
    if order != "newest":  # (a newest-first cursor keeps the shape it always had)
        position.append(order)
    raw = json.dumps(position).encode()
    return base64.urlsafe_b64encode(raw).decode("ascii")


def _decode_cursor(cursor: str, order: Order | None = None) -> tuple[dt.datetime, str]:
    """The position a cursor holds; ``order`` given, it must be the order it was made for."""
    try:
        stamp, session_id, *rest = json.loads(base64.urlsafe_b64decode(cursor.encode("ascii")))
        made_for = str(rest[0]) if rest else "newest"
        position = dt.datetime.fromisoformat(stamp), str(session_id)
    except (ValueError, TypeError, UnicodeError) as exc:
        msg = "invalid cursor: pass the next_cursor of a previous page unchanged"
        raise ValueError(msg) from exc
    if order is not None and made_for != order:
        msg = f"this cursor continues an order={made_for!r} listing; pass order={made_for!r}"
        raise ValueError(msg)
    return position


def _naive_utc(value: dt.datetime, what: str) -> dt.datetime:
    """A time as the store keeps times (naive UTC); an aware one is converted."""
    if not isinstance(value, dt.datetime):
        msg = f"{what} must be a datetime.datetime, got {value!r}"
        raise TypeError(msg)
    return value if value.tzinfo is None else value.astimezone(dt.UTC).replace(tzinfo=None)


def backend_of(store: SessionStore) -> Backend:
    """The backend under a store, for the package's own admin operations."""
    return store._backend  # noqa: SLF001 - the class's own module


class SessionStore(AsyncClosing):
    """Sessions over one engine and one table-name set, plus listing and deletion.

    ``encryption=Keyring(...)`` encrypts every session's items at rest (metadata
    stays plaintext, for filtering); :meth:`rotate_keys` moves them to a new key.
    ``ttl=timedelta(...)``: every session written through the store expires that
    long after its latest write (``add_items``, ``replace_items``, a fork's
    target); an expired session reads as empty at once and the next
    :meth:`prune` deletes it.
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
        ttl: dt.timedelta | None = None,
    ) -> None:
        names = TableNames(sessions_table, messages_table)
        self._backend = Backend(
            engine,
            names,
            create_tables=create_tables,
            on_corrupt=on_corrupt,
            encryption=encryption,
            ttl=ttl,
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

    def advanced_session(
        self,
        session_id: str,
        *,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> AdvancedSQLAlchemySession:
        """A session with turns, branches and usage (:class:`AdvancedSQLAlchemySession`).

        Over this store's pool, like :meth:`session`; its current branch is the
        object's own, so keep the object for as long as you work on one branch.
        """
        settings = coerce_settings(session_settings)
        return AdvancedSQLAlchemySession._from_backend(  # noqa: SLF001
            session_id,
            self._backend,
            settings if settings is not None else self.session_settings,
            ensure_ascii=self.ensure_ascii,
        )

    def _listing(self) -> Select[Any]:
        """Live sessions with their item counts (a correlated count per row, using the index).

        An expired session (``expires_at`` passed) is left out before any prune removes it.
        """
        st = self._backend.st
        s, m = st.sessions.c, st.messages.c
        db = self._backend.db
        now = bindparam("now", db.stamp(utcnow()), type_=db.stamp_type(s.expires_at.type))
        count = select(func.count()).where(m.session_id == s.session_id).scalar_subquery()
        return select(
            s.session_id, s.created_at, s.updated_at, count.label("item_count"), s["metadata"]
        ).where(or_(s.expires_at.is_(None), s.expires_at > now))

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
        updated_before: dt.datetime | None = None,
        order: Order = "newest",
    ) -> SessionPage:
        """Sessions by last update (``order``: ``newest`` or ``oldest`` first), paginated by keyset.

        Keyset pagination (not OFFSET) keeps every page equally fast and never
        repeats a session while you page. ``metadata={"user": "u1"}`` keeps only
        sessions whose metadata has each of those keys with exactly that value;
        ``updated_before`` only sessions last written to before that time (naive
        means UTC), which with ``order="oldest"`` shows what
        ``prune(older_than=...)`` would delete first. Expired sessions are not listed.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_SIZE:
            msg = f"limit must be an int from 1 to {MAX_PAGE_SIZE}, got {limit!r}"
            raise ValueError(msg)
        if order not in ("newest", "oldest"):
            msg = f"order must be 'newest' or 'oldest', got {order!r}"
            raise ValueError(msg)
        s = self._backend.st.sessions.c
        db = self._backend.db  # times as the column holds them (SQLite: its own text)
        stamp_type = db.stamp_type(s.updated_at.type)
        keys = (s.updated_at, s.session_id)
        by = [k.desc() for k in keys] if order == "newest" else list(keys)
        query = self._listing().order_by(*by).limit(limit + 1)
        if metadata is not None:
            sessions = self._backend.st.sessions
            query = query.where(metadata_filter(self._backend.db, sessions, metadata))
        if updated_before is not None:
            before = db.stamp(_naive_utc(updated_before, "updated_before"))
            query = query.where(
                s.updated_at < bindparam("updated_before", before, type_=stamp_type)
            )
        if cursor is not None:
            stamp, after_id = _decode_cursor(cursor, order)
            stamp_param = bindparam("after_stamp", db.stamp(stamp), type_=stamp_type)
            position = tuple_(stamp_param, after_id)
            query = query.where(
                tuple_(*keys) < position if order == "newest" else tuple_(*keys) > position
            )
        rows = await self._backend.fetch(query)
        infos = [self._info(r) for r in rows[:limit]]
        next_cursor = _encode_cursor(infos[-1], order) if len(rows) > limit else None
        return SessionPage(infos, next_cursor)

    async def get_session(self, session_id: str) -> SessionInfo | None:
        """The listing entry of one session, or ``None`` if it does not exist."""
        s = self._backend.st.sessions.c
        query = self._listing().where(s.session_id == validate_session_id(session_id))
        rows = await self._backend.fetch(query)
        return self._info(rows[0]) if rows else None

    async def fork(
        self, session_id: str, new_session_id: str, *, at_turn: int | None = None
    ) -> SQLAlchemySession:
        """Copy a session to a new id, in one transaction on the database; the new session.

        The copy holds the source's items in order (each keeping its ``created_at``)
        and its metadata; the new session's ``created_at``/``updated_at`` are now.
        Items are copied by ``INSERT … SELECT`` and never pass through Python, so
        a fork costs about as much as the rows it writes.

        ``at_turn=N`` copies the history as it stood when user turn ``N`` was about
        to start: the items *before* the ``N``-th item whose ``role`` is ``"user"``
        (counting from 1), as the Agents SDK's ``create_branch_from_turn(N)`` does,
        so the fork can take turn ``N`` another way. ``at_turn=1`` copies nothing but
        the metadata.

        Raises :class:`SessionNotFoundError` when ``session_id`` does not exist,
        :class:`SessionExistsError` when ``new_session_id`` does (also the loser of
        two concurrent forks to one id), :class:`TurnNotFoundError` when the source
        has fewer than ``N`` user turns; in each case nothing was written.
        """
        source = validate_session_id(session_id)
        target = validate_session_id(new_session_id)
        if target == source:
            msg = "new_session_id must differ from session_id (a fork is a new session)"
            raise ValueError(msg)
        skip: int | None = None
        if at_turn is not None:
            if isinstance(at_turn, bool) or not isinstance(at_turn, int):
                msg = f"at_turn must be an int (a user turn, from 1) or None, got {at_turn!r}"
                raise TypeError(msg)
            if at_turn < 1:
                msg = f"at_turn counts user turns from 1, got {at_turn}"
                raise ValueError(msg)
            check_sql_int("at_turn", at_turn)
            skip = at_turn - 1
        await self._backend.fork(source, target, skip)
        return self.session(target)

    async def delete_session(self, session_id: str, *, force: bool = False) -> bool:
        """Delete a session and all its items; ``True`` if it existed.

        A session holding encrypted items this store's keyring cannot open (or any,
        without a keyring) is refused with :class:`~agents_memory.DecryptionError`
        and left whole; ``force=True`` deletes it anyway (a key that is lost for good).

        The branch names an advanced session used and its clear generation go too
        (``clear_session`` keeps them, as the SDK does), in a second transaction
        right after, and only while no session row of that id exists again; a crash
        between the two leaves them (as after a clear) and calling this again
        deletes them. The id is then new: an object still holding a branch of the
        deleted session is not told (only a clear moves the generation on).
        """
        sid = validate_session_id(session_id)
        existed = await self._backend.clear(sid, force=force)
        models = get_models(self._backend.names)
        sessions = self._backend.st.sessions
        gone = ~exists(select(sessions.c.session_id).where(sessions.c.session_id == sid))
        async with self._backend.transaction() as conn:
            for table in (models.Branch.__table__, models.ClearGeneration.__table__):
                await conn.execute(delete(table).where(table.c.session_id == sid, gone))
        return existed

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

    async def prune(
        self,
        *,
        older_than: dt.timedelta | None = None,
        keep_last: int | None = None,
        metadata: Mapping[str, FilterValue] | None = None,
        dry_run: bool = False,
    ) -> PruneReport:
        """Apply a retention policy: delete old and expired sessions, trim long ones.

        ``older_than`` deletes every session not written to for that long;
        ``keep_last=N`` trims every other session to its newest ``N`` items;
        ``metadata`` limits both to sessions with those tags. Expired sessions
        (see ``ttl``) are always deleted. ``dry_run=True`` deletes nothing and
        reports what a real run would delete now.

        Safe on a live database: many short transactions (a bounded batch each,
        walking sessions by keyset, so memory stays bounded), each re-checking its
        condition, so a session written to meanwhile is kept and a trim never
        deletes an item added after it started. Killed at any moment, it leaves
        each session untouched, deleted whole, or a contiguous newest suffix. Two
        prunes at once reach the same end state.
        """
        return await prune(
            self._backend,
            older_than=older_than,
            keep_last=keep_last,
            metadata=metadata,
            dry_run=dry_run,
        )

    async def stats(self, *, largest: int = 5) -> StoreStats:
        """Totals for the store: sessions, items, time span and the ``largest`` biggest sessions."""
        return await store_stats(self._backend, largest=largest)

    async def close(self) -> None:
        """Dispose the engine if the store created it (``from_url``); sessions then raise."""
        await self._backend.close()
