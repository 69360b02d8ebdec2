"""``AdvancedSQLAlchemySession``: the SDK's ``AdvancedSQLiteSession`` API on every SQL database.

Turns, branches and token usage live in three tables of the name set
(``TableNames.structure``, ``.turn_usage``, ``.branches``) that plain sessions
never touch, so plain ``add_items`` pays nothing for them. Every statement here
is portable Core built from the models; what differs per database (the clock of
a write, the session-row upsert) comes from the engine's database module.

Each write is one transaction that starts by upserting the session row: that
takes the row's lock on Postgres and MySQL and the file's write lock on SQLite,
so two writers of one session (two processes, say) queue there, and the
sequence and turn numbers they read next are the latest.

The current branch is this object's own state (as in the SDK): ``main`` until
:meth:`switch_to_branch` or a new branch, and again after :meth:`clear_session`.
Branch names stay used after a clear, as in the SDK (revision 0005); deleting the
session (``SessionStore.delete_session``, ``prune``) frees them.

A clear by another object or process moves the session's clear generation on
(``TableNames.clear_generations``, revision 0007, the SDK's
``session_clear_generations``). An object on a branch other than ``main``
remembers the generation it chose that branch at and compares it, in the same
transaction or read, before each operation on its current branch: when it has
moved, the operation acts on ``main`` and the object stays there. An object on
``main`` reads nothing more.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    String,
    Table,
    and_,
    bindparam,
    case,
    delete,
    exists,
    func,
    insert,
    or_,
    select,
    type_coerce,
    update,
)
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection

from agents_memory._codec import decode_rows, encode_items
from agents_memory._crypto import Keyring, is_envelope, open_envelope
from agents_memory._databases.base import check_heads, heads_where, numbered, upsert_counting
from agents_memory._ids import check_sql_int
from agents_memory._protocol import resolve_limit, writes_overridden
from agents_memory._sqlalchemy._backend import Backend
from agents_memory._sqlalchemy._cancel import run_to_completion
from agents_memory._sqlalchemy._engine import create_engine
from agents_memory._sqlalchemy._session import SQLAlchemySession
from agents_memory._tables import DEFAULT_MESSAGES_TABLE, DEFAULT_SESSIONS_TABLE
from agents_memory.models import BRANCH_ID_MAX_LENGTH, get_models

if TYPE_CHECKING:
    from agents_memory._protocol import SessionSettings, TResponseInputItem

T = TypeVar("T")

MAIN = "main"

_BRANCH = "branch"
"""The bound parameter of a read's branch: the current one is known only on the connection."""

TOOL_CALL_TYPES = (
    "tool_call",
    "function_call",
    "computer_call",
    "file_search_call",
    "web_search_call",
    "code_interpreter_call",
    "tool_search_call",
    "custom_tool_call",
    "mcp_call",
    "mcp_approval_request",
    "shell_call",
    "apply_patch_call",
)
"""Structure rows counted by :meth:`AdvancedSQLAlchemySession.get_tool_usage` (the SDK's list)."""

_TYPE_NAMED_TOOLS = {
    "computer_call",
    "file_search_call",
    "web_search_call",
    "code_interpreter_call",
    "shell_call",
    "apply_patch_call",
}

_log = logging.getLogger("agents_memory.advanced")


# -- what an item is (the SDK's rules, so rows it wrote and ours read alike) ---------------------


def message_type(item: dict[str, Any]) -> str:
    """``user``, ``assistant``, the item's ``type``, or ``other``."""
    role = item.get("role")
    if role in ("user", "assistant"):
        return str(role)
    kind = item.get("type")
    return str(kind) if kind else "other"


def tool_name(item: dict[str, Any]) -> str | None:  # noqa: PLR0911 - the SDK's cases
    """The tool an item calls or answers, named as the SDK names it (``None`` for messages)."""
    kind = item.get("type")
    if kind in ("mcp_call", "mcp_approval_request") and "server_label" in item:
        label, name = item.get("server_label"), item.get("name")
        if name and label:
            return f"{label}.{name}"
        return str(label) if label else (str(name) if name else None)
    if kind in ("tool_search_call", "tool_search_output"):
        return "tool_search"
    if kind in _TYPE_NAMED_TOOLS:
        return str(kind)
    if "name" in item:
        name, namespace = item.get("name"), item.get("namespace")
        if name is None:
            return None
        name = str(name)
        if isinstance(namespace, str) and namespace and namespace != name and name:
            return f"{namespace}.{name}"
        return name
    return None


def _preview(content: object, max_length: int | None = None) -> str:
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    if max_length is not None and len(text) > max_length:
        return text[:max_length] + "..."
    return text


def _timestamp(value: object) -> str | None:
    """A time as the SDK's SQLite rows give it: ``YYYY-MM-DD HH:MM:SS`` text."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)[:19]  # SQLite's text, to the second


def _details(value: object) -> str | None:
    """Token details (a pydantic model in the SDK's ``Usage``) as JSON text, or ``None``."""
    if not value:
        return None
    dump = getattr(value, "model_dump", None)
    data = dump() if callable(dump) else getattr(value, "__dict__", value)
    try:
        return json.dumps(data)
    except (TypeError, ValueError):
        _log.warning("token details of type %s are not JSON; not stored", type(value).__name__)
        return None


def _loads(text: object) -> Any:  # noqa: ANN401 - JSON
    if not text:
        return None
    try:
        return json.loads(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def _validate_branch_id(branch_id: object, what: str = "branch_id") -> str:
    if not isinstance(branch_id, str):
        msg = f"{what} must be a str, got {type(branch_id).__name__}"
        raise TypeError(msg)
    if len(branch_id) > BRANCH_ID_MAX_LENGTH:
        msg = f"{what} must be at most {BRANCH_ID_MAX_LENGTH} characters, got {len(branch_id)}"
        raise ValueError(msg)
    return branch_id


def _holds(structure: Any, messages: Any) -> ColumnElement[bool]:  # noqa: ANN401 - tables
    """A structure row's item: the same session, at the row's ``message_position``."""
    return and_(
        structure.c.session_id == messages.c.session_id,
        structure.c.message_position == messages.c.position,
    )


class AdvancedSQLAlchemySession(SQLAlchemySession):
    """A session with user turns, branches and token usage, on SQLite, Postgres or MySQL.

    The public API of the Agents SDK's ``AdvancedSQLiteSession`` (0.24): the
    Session protocol reads and writes the current branch; ``store_run_usage``
    after each ``Runner.run``; ``create_branch_from_turn`` to try another
    answer from an earlier user message while the original branch stays as it
    was. Construct it like :class:`SQLAlchemySession` (``engine=`` or
    :meth:`from_url`), or ask a store: ``store.advanced_session(session_id)``.
    """

    def __init__(
        self,
        session_id: str,
        *,
        engine: Any,  # noqa: ANN401 - an AsyncEngine (as SQLAlchemySession's)
        create_tables: bool = False,
        sessions_table: str | None = None,
        messages_table: str | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        ensure_ascii: bool = False,
        on_corrupt: Any = "skip",  # noqa: ANN401 - OnCorrupt
        logger: logging.Logger | None = None,
        encryption: Keyring | None = None,
        ttl: dt.timedelta | None = None,
    ) -> None:
        super().__init__(
            session_id,
            engine=engine,
            create_tables=create_tables,
            sessions_table=sessions_table or DEFAULT_SESSIONS_TABLE,
            messages_table=messages_table or DEFAULT_MESSAGES_TABLE,
            session_settings=session_settings,
            ensure_ascii=ensure_ascii,
            on_corrupt=on_corrupt,
            encryption=encryption,
            ttl=ttl,
        )
        if logger is not None:
            self._logger = logger

    def _init(
        self,
        session_id: str,
        backend: Backend,
        session_settings: SessionSettings | None,
        *,
        owns_backend: bool,
        ensure_ascii: bool,
    ) -> None:
        super()._init(
            session_id,
            backend,
            session_settings,
            owns_backend=owns_backend,
            ensure_ascii=ensure_ascii,
        )
        models = get_models(backend.names)
        self._structure: Table = models.Structure.__table__
        self._usage: Table = models.TurnUsage.__table__
        self._branches: Table = models.Branch.__table__
        self._generations: Table = models.ClearGeneration.__table__
        self._branch = MAIN
        self._generation = 0
        """The session's clear generation when :attr:`_branch` was chosen (for a branch only)."""
        self._clears = 0
        """Clears this object has finished: a branch chosen before one is not taken up after."""
        self._logger = _log

    # -- plumbing -------------------------------------------------------------------------------

    @property
    def current_branch_id(self) -> str:
        """The branch the Session protocol reads and writes."""
        return self._branch

    async def _read(self, body: Callable[[AsyncConnection], Awaitable[T]], empty: T) -> T:
        """``body`` on a read connection; ``empty`` (a new session's answer) if it has expired."""
        async with self._live().reading() as conn:
            if await self._expired(conn):
                return empty
            return await body(conn)

    async def _expired(self, conn: AsyncConnection, clock: dict[str, Any] | None = None) -> bool:
        """Whether this session's deadline has passed (never, on tables without ``expires_at``).

        An expired session reads as empty, as plain sessions' reads do in their own
        statements; under a writer's lock the answer holds until it commits. ``clock``:
        the write's own parameters, so that SQLite compares with the time its upsert
        stamps (the one ``now``), not a later one.
        """
        backend = self._backend
        probe = backend.db.statements(backend.names, backend.expiry).select_expired
        if probe is None:
            return False
        params = {"sid": self.session_id, **(backend.db.clock_params() if clock is None else clock)}
        return bool((await conn.execute(probe, params)).scalar())

    async def _restart(self, conn: AsyncConnection) -> None:
        """An expired session starts afresh (a writer, under the lock): all it held goes.

        Items, turn rows, usage and reserved branch names, each deleted by name: the
        row stays, so no cascade from it runs, and usage and branch names hang off
        the session, not the items. Not checked
        against the keyring, as a plain session's write to an expired one is not.
        The session is back on ``main``, as after ``clear_session``, for every object
        of it (the clear generation moves on).
        """
        sid = self.session_id
        for table in (self._structure, self._usage, self._branches, self._backend.st.messages):
            await conn.execute(delete(table).where(table.c.session_id == sid))
        # As a clear: objects still on a branch of the old history go back to main.
        await conn.execute(self._backend.db.bump_generation(self._generations), {"sid": sid})
        self._branch = MAIN

    async def _write(self, body: Callable[[AsyncConnection], Awaitable[T]]) -> T:
        """Run ``body`` as one transaction, again if the database made it a deadlock victim.

        Run to completion through a cancel: on SQLite a started statement cannot be
        stopped (see ``_cancel``); elsewhere the caller gets its answer either way.
        """
        return await run_to_completion(self._live().retried(body))

    async def _lock_session(self, conn: AsyncConnection, n: int = 0) -> int:
        """Create or touch the session row: the lock every writer of this session queues on.

        The write takes ``n`` positions (the session's ``last_position`` moved past
        them) and returns the counter after: the items it appends take the ``n``
        positions up to it. On tables with ``expires_at`` the write renews the
        deadline (the store's ``ttl``), and a session whose deadline has passed
        starts afresh first, in this transaction (:meth:`_restart`), as plain
        sessions' writes do.
        """
        backend = self._backend
        st = backend.db.statements(backend.names, backend.expiry)
        params = {"sid": self.session_id, "expires": backend.deadline(), "n": n}
        params.update(backend.db.clock_params())
        if st.restart_session is None:
            # The upsert renews or clears a passed deadline, so what it kept goes first,
            # under the row's lock (an UPDATE: on SQLite the file's write lock too).
            if st.select_expired is not None and not await self._lock_existing(conn, params):
                await self._restart(conn)
            return await upsert_counting(conn, st, params)
        # The upsert locks an expired row and leaves it as it is: restarted here.
        await conn.execute(st.upsert_session, params)
        if await self._expired(conn, params):
            await self._restart(conn)
            await conn.execute(st.restart_session, params)
        assert st.read_counter is not None  # noqa: S101 - the head variant has it
        return int((await conn.execute(st.read_counter, params)).scalar_one())

    async def _lock_existing(
        self, conn: AsyncConnection, clock: dict[str, Any] | None = None
    ) -> bool:
        """Take the same lock without creating the session row (a pop of an empty session).

        Returns whether the session is live: an expired one reads as empty to the
        writes that take this lock (they do not renew it, as a plain pop does not).

        A write as the transaction's first statement, even one matching no row: on
        SQLite it takes the file's write lock up front (waiting out the busy
        timeout), where a read first would fail at once on a later write if
        another process committed in between.
        """
        sessions = self._backend.st.sessions
        await conn.execute(
            update(sessions)
            .where(sessions.c.session_id == self.session_id)
            .values(updated_at=sessions.c.updated_at)
        )
        return not await self._expired(conn, clock)

    def _open(self, data: object, row_id: object) -> object:
        """An item's stored text, opened with the keyring if it is an envelope.

        One the keyring cannot open raises the typed error, as ``get_items`` does.
        """
        if is_envelope(data):
            return open_envelope(str(data), self._backend.keyring, row_id=row_id)
        return data

    def _seal(self, data: list[str]) -> list[str]:
        """Encoded items as they are written: sealed under the keyring's current key, if any."""
        keyring = self._backend.keyring
        return keyring.encrypt_all(data) if keyring is not None else data

    async def _check_deletable(self, conn: AsyncConnection, which: ColumnElement[bool]) -> None:
        """Refuse (the typed error) to delete messages ``which`` the keyring could not open.

        As plain sessions' clear and replace do: read the envelope heads of what is
        about to go, inside the same transaction, before deleting anything.
        """
        rows = (await conn.execute(heads_where(self._backend.st.messages, which))).all()
        check_heads(rows, self._backend.keyring)

    async def _generation_now(self, conn: AsyncConnection) -> int:
        """How many times the session has been cleared (no row: never)."""
        g = self._generations.c
        found = (
            await conn.execute(select(g.generation).where(g.session_id == self.session_id))
        ).scalar()
        return int(found or 0)

    async def _resolve(self, conn: AsyncConnection, state: tuple[str, int]) -> str:
        """The branch an operation called on ``state`` (branch, generation) acts on.

        ``main`` when another object has cleared the session since the branch was
        chosen (the generation moved on); the object is then back on ``main``,
        unless it has moved meanwhile. On ``main`` nothing is read.
        """
        branch, generation = state
        if branch == MAIN:
            return MAIN
        now = await self._generation_now(conn)
        if now == generation:
            return branch
        if (self._branch, self._generation) == state:
            self._branch, self._generation = MAIN, now
            self._logger.debug("%r was cleared elsewhere: back on main", self.session_id)
        return MAIN

    async def _branch_for(self, conn: AsyncConnection, branch_id: str | None) -> str:
        """``branch_id``, or the current branch as :meth:`_resolve` finds it."""
        if branch_id is not None:
            return _validate_branch_id(branch_id)
        return await self._resolve(conn, (self._branch, self._generation))

    async def _bind_branch(self, conn: AsyncConnection, branch_id: str | None) -> dict[str, str]:
        """The ``_BRANCH`` parameter of a read: :meth:`_branch_for`."""
        return {_BRANCH: await self._branch_for(conn, branch_id)}

    def _choose(self, branch: str, generation: int, clears: int) -> bool:
        """Make ``branch`` current, read at ``generation``, unless this object cleared since."""
        if self._clears != clears:
            return False  # a clear finished meanwhile: its main wins
        self._branch, self._generation = branch, generation
        return True

    def _where(self, branch: str | BindParameter[str]) -> ColumnElement[bool]:
        s = self._structure.c
        return and_(s.session_id == self.session_id, s.branch_id == branch)

    def _branch_of(self, branch_id: str | None) -> str:
        return self._branch if branch_id is None else _validate_branch_id(branch_id)

    # -- the Session protocol, on the current branch --------------------------------------------

    async def get_items(
        self, limit: int | None = None, branch_id: str | None = None
    ) -> list[TResponseInputItem]:
        """The latest ``limit`` items of the current branch (or ``branch_id``), oldest first."""
        n = resolve_limit(limit, self.session_settings)
        if n == 0:
            return []
        if n is not None:
            check_sql_int("limit", n)
        self._branch_of(branch_id)  # checked before any read
        m, s = self._backend.st.messages, self._structure
        on_corrupt, keyring = self._backend.on_corrupt, self._backend.keyring

        async def body(conn: AsyncConnection) -> list[dict[str, Any]]:
            query = (
                select(m.c.position, m.c.message_data)
                .join(s, _holds(s, m))
                .where(self._where(await self._branch_for(conn, branch_id)))
                .order_by(s.c.sequence_number.desc())
            )
            if n is None:
                rows = (await conn.execute(query)).all()
                return decode_rows(reversed(rows), on_corrupt=on_corrupt, keyring=keyring)
            window = n
            while True:  # corrupt rows skipped: read further back so ``limit`` counts items
                rows = (await conn.execute(query.limit(window))).all()
                items = decode_rows(reversed(rows), on_corrupt=on_corrupt, keyring=keyring)
                if len(items) >= n or len(rows) < window:
                    return items[-n:]
                window *= 2

        items: list[Any] = await self._read(body, [])
        return items

    async def iter_items(self, *, batch_size: int = 500) -> AsyncIterator[TResponseInputItem]:
        """Every item of the current branch, oldest first."""
        if batch_size < 1:
            msg = f"batch_size must be >= 1, got {batch_size}"
            raise ValueError(msg)
        for item in await self.get_items(limit=None):
            yield item

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` to the current branch: the items and their turns in one transaction.

        A user message starts a new turn; the items after it (tool calls, the
        answer) belong to it. With a keyring the items are sealed before the write.
        """
        data = encode_items(items, ensure_ascii=self._ensure_ascii)
        self._live()
        if not data:
            return
        data = self._seal(data)
        kinds = [(message_type(item), tool_name(item)) for item in items]  # type: ignore[arg-type]
        state = (self._branch, self._generation)  # a later switch does not redirect this call

        async def body(conn: AsyncConnection) -> None:
            top = await self._lock_session(conn, len(data))
            await self._append(conn, await self._resolve(conn, state), data, kinds, top)

        await self._write(body)

    async def _append(
        self,
        conn: AsyncConnection,
        branch: str,
        data: list[str],
        kinds: list[tuple[str, str | None]],
        top: int,
    ) -> None:
        """Insert encoded items and their structure rows on ``branch`` (under the lock).

        ``top``: the session's counter after :meth:`_lock_session` took ``len(data)``
        positions; the items take the positions up to it.
        """
        sid = self.session_id
        backend = self._backend
        s = self._structure
        params = numbered(sid, data, top, backend.db.clock_params())
        await conn.execute(backend.st.insert_message, params)
        positions = [p["pos"] for p in params]
        seq = (
            await conn.execute(
                select(func.coalesce(func.max(s.c.sequence_number), 0)).where(s.c.session_id == sid)
            )
        ).scalar_one()
        turn, branch_turn = (
            await conn.execute(
                select(
                    func.coalesce(func.max(s.c.user_turn_number), 0),
                    func.coalesce(func.max(s.c.branch_turn_number), 0),
                ).where(self._where(branch))
            )
        ).one()
        rows = []
        users = 0
        for i, (position, (kind, tool)) in enumerate(zip(positions, kinds, strict=True)):
            if kind == "user":
                users += 1
            rows.append(
                {
                    "session_id": sid,
                    "message_position": position,
                    "branch_id": branch,
                    "message_type": kind,
                    "sequence_number": int(seq) + i + 1,
                    "user_turn_number": int(turn) + users,
                    "branch_turn_number": int(branch_turn) + users,
                    "tool_name": tool,
                }
            )
        await conn.execute(insert(s), rows)

    async def replace_items(self, items: list[TResponseInputItem]) -> None:
        """Replace the current branch's history with ``items``, atomically: old or new.

        One transaction: the branch's turns and usage go, with the items no other
        branch holds (refused whole, the typed error, if the keyring could not
        open one of them); then ``items`` are appended as :meth:`add_items` would,
        their turns counted from 1. Other branches keep what they share with it.
        This is what the SDK's compaction wrapper swaps history through.
        """
        data = self._seal(encode_items(items, ensure_ascii=self._ensure_ascii))
        self._live()
        kinds = [(message_type(item), tool_name(item)) for item in items]  # type: ignore[arg-type]
        state = (self._branch, self._generation)

        async def body(conn: AsyncConnection) -> None:
            top = await self._lock_session(conn, len(data))
            branch = await self._resolve(conn, state)
            await self._drop_branch(conn, branch)
            if data:
                await self._append(conn, branch, data, kinds, top)

        await self._write(body)

    async def _atomic_replace_items(self, items: list[TResponseInputItem]) -> bool:
        """The SDK's compaction hook: the current branch swapped through :meth:`replace_items`.

        ``False`` (the SDK's clear-then-add) for a subclass that changes how items
        are written but not ``replace_items``, as for plain sessions.
        """
        if writes_overridden(type(self), AdvancedSQLAlchemySession):
            return False
        await self.replace_items(items)
        return True

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item of the current branch.

        The item's row goes only when no other branch still holds it; a turn left
        with no items loses its usage row too.
        """
        state, sid = (self._branch, self._generation), self.session_id
        m, s, u = self._backend.st.messages, self._structure, self._usage
        on_corrupt, keyring = self._backend.on_corrupt, self._backend.keyring

        async def body(conn: AsyncConnection) -> dict[str, Any] | None:
            if not await self._lock_existing(conn):
                return None  # expired: empty (its items wait for a write or a prune)
            branch = await self._resolve(conn, state)
            while True:
                row = (
                    await conn.execute(
                        select(s.c.sequence_number, s.c.message_position, s.c.user_turn_number)
                        .where(self._where(branch))
                        .order_by(s.c.sequence_number.desc())
                        .limit(1)
                    )
                ).first()
                if row is None:
                    return None
                gone = await conn.execute(
                    delete(s).where(self._where(branch), s.c.sequence_number == row.sequence_number)
                )
                if gone.rowcount != 1:  # another writer popped it first
                    continue
                item = and_(m.c.session_id == sid, m.c.position == row.message_position)
                data = (await conn.execute(select(m.c.message_data).where(item))).scalar()
                await self._drop_unshared(conn, item)
                if row.user_turn_number is not None:
                    left = (
                        await conn.execute(
                            select(func.count()).where(
                                self._where(branch),
                                s.c.user_turn_number == row.user_turn_number,
                            )
                        )
                    ).scalar_one()
                    if not left:
                        await conn.execute(
                            delete(u).where(
                                u.c.session_id == sid,
                                u.c.branch_id == branch,
                                u.c.user_turn_number == row.user_turn_number,
                            )
                        )
                if data is None:
                    continue
                # A row the keyring cannot open raises here: the transaction rolls back,
                # so nothing is deleted because it could not be read.
                items = decode_rows(
                    [(row.message_position, data)], on_corrupt=on_corrupt, keyring=keyring
                )
                if items:
                    return items[0]

        item: Any = await self._write(body)
        return item  # type: ignore[no-any-return]

    async def _drop_branch(self, conn: AsyncConnection, branch: str) -> None:
        """Delete a branch's structure rows and usage, and the items no other branch holds.

        First, as a clear does, the items to delete are checked against the keyring:
        one it could not open refuses the whole write (nothing is deleted unread).
        """
        m, s, u, sid = self._backend.st.messages, self._structure, self._usage, self.session_id
        mine = self._where(branch)
        other = s.alias("other")
        unshared = and_(
            m.c.session_id == sid,
            m.c.position.in_(select(s.c.message_position).where(mine)),
            ~exists(
                select(other.c.sequence_number).where(_holds(other, m), other.c.branch_id != branch)
            ),
        )
        await self._check_deletable(conn, unshared)
        await conn.execute(delete(m).where(unshared))
        await conn.execute(delete(s).where(mine))
        await conn.execute(delete(u).where(u.c.session_id == sid, u.c.branch_id == branch))

    async def _drop_unshared(self, conn: AsyncConnection, which: ColumnElement[bool]) -> None:
        """Delete the messages of this session matching ``which`` that no branch holds."""
        m, s = self._backend.st.messages, self._structure
        await conn.execute(
            delete(m).where(
                m.c.session_id == self.session_id,
                which,
                ~exists(select(s.c.sequence_number).where(_holds(s, m))),
            )
        )

    async def clear_session(self) -> None:
        """Delete the session: its items, every branch and all usage; back on ``main``.

        One transaction, as the SDK's: every branch name used so far stays used
        (the branches holding items are reserved; ``main`` has no reservation row
        of its own until then), and the session's clear generation moves on, so
        other objects of this session still on a branch act on ``main`` from their
        next operation. As a plain clear, the session row is locked first (the
        database's ``lock_session`` where it has one, which a key rotation's batch
        waits for too) and nothing is deleted that the keyring could not open.
        """
        backend = self._live()
        b, s, sid = self._branches, self._structure, self.session_id
        held = (
            select(s.c.session_id, s.c.branch_id)
            .distinct()
            .where(
                s.c.session_id == sid,
                ~exists(
                    select(b.c.branch_id).where(
                        b.c.session_id == s.c.session_id, b.c.branch_id == s.c.branch_id
                    )
                ),
            )
        )

        sessions, messages = backend.st.sessions, backend.st.messages
        lock = backend.st.lock_session

        async def body(conn: AsyncConnection) -> int:
            await self._lock_existing(conn)  # SQLite: the file's write lock, first
            if lock is not None:
                await conn.execute(lock, {"sid": sid})
            await conn.execute(insert(b).from_select(["session_id", "branch_id"], held))
            await self._check_deletable(conn, messages.c.session_id == sid)
            for table in (self._structure, self._usage, messages):
                await conn.execute(delete(table).where(table.c.session_id == sid))
            gone = await conn.execute(delete(sessions).where(sessions.c.session_id == sid))
            if gone.rowcount:
                await conn.execute(backend.db.bump_generation(self._generations), {"sid": sid})
            return await self._generation_now(conn)

        generation = await self._write(body)
        self._branch, self._generation = MAIN, generation
        self._clears += 1

    # -- usage ----------------------------------------------------------------------------------

    async def store_run_usage(self, result: Any) -> None:  # noqa: ANN401 - the SDK's RunResult
        """Record ``result.context_wrapper.usage`` for the current turn of the current branch.

        Call it after ``Runner.run``. Like the SDK, a failure is logged, not raised
        (usage is bookkeeping; the run itself succeeded). Storing again replaces.
        """
        try:
            usage = result.context_wrapper.usage
            if usage is None:
                return
            state, sid = (self._branch, self._generation), self.session_id
            s, u = self._structure, self._usage
            values = {
                "requests": int(usage.requests or 0),
                "input_tokens": int(usage.input_tokens or 0),
                "output_tokens": int(usage.output_tokens or 0),
                "total_tokens": int(usage.total_tokens or 0),
                "input_tokens_details": _details(getattr(usage, "input_tokens_details", None)),
                "output_tokens_details": _details(getattr(usage, "output_tokens_details", None)),
            }

            async def body(conn: AsyncConnection) -> None:
                if not await self._lock_existing(conn):
                    self._logger.debug("%r has expired: no turn to store usage for", sid)
                    return
                branch = await self._resolve(conn, state)
                if branch != state[0]:  # cleared since the call: that run's turn is gone
                    self._logger.debug("%r was cleared: no turn to store usage for", sid)
                    return
                turn = (
                    await conn.execute(
                        select(func.max(s.c.user_turn_number)).where(self._where(branch))
                    )
                ).scalar()
                if not turn:
                    self._logger.debug("no turn on branch %r to store usage for", branch)
                    return
                key = and_(
                    u.c.session_id == sid, u.c.branch_id == branch, u.c.user_turn_number == turn
                )
                await conn.execute(delete(u).where(key))
                await conn.execute(
                    insert(u).values(
                        session_id=sid, branch_id=branch, user_turn_number=turn, **values
                    )
                )

            await self._write(body)
        except Exception:
            self._logger.exception("failed to store the run's usage for %r", self.session_id)

    async def get_session_usage(self, branch_id: str | None = None) -> dict[str, int] | None:
        """Usage summed over every turn of every branch (or of ``branch_id``); ``None`` if none."""
        u = self._usage
        where = [u.c.session_id == self.session_id]
        if branch_id:
            where.append(u.c.branch_id == _validate_branch_id(branch_id))
        query = select(
            func.sum(u.c.requests),
            func.sum(u.c.input_tokens),
            func.sum(u.c.output_tokens),
            func.sum(u.c.total_tokens),
            func.count(),
        ).where(*where)

        async def body(conn: AsyncConnection) -> dict[str, int] | None:
            row = (await conn.execute(query)).one()
            if row[0] is None:
                return None
            keys = ("requests", "input_tokens", "output_tokens", "total_tokens", "total_turns")
            return {k: int(v or 0) for k, v in zip(keys, row, strict=True)}

        return await self._read(body, None)

    async def get_turn_usage(
        self, user_turn_number: int | None = None, branch_id: str | None = None
    ) -> list[dict[str, Any]] | dict[str, Any]:
        """Usage per turn of the current branch (or ``branch_id``), with token details.

        One turn's dict (``{}`` if it has none) when ``user_turn_number`` is given,
        else a list of every turn's, in turn order.
        """
        self._branch_of(branch_id)  # checked before any read
        u = self._usage
        columns = (
            u.c.user_turn_number,
            u.c.requests,
            u.c.input_tokens,
            u.c.output_tokens,
            u.c.total_tokens,
            u.c.input_tokens_details,
            u.c.output_tokens_details,
        )
        query = select(*columns).where(
            u.c.session_id == self.session_id, u.c.branch_id == bindparam(_BRANCH)
        )
        if user_turn_number is not None:
            query = query.where(u.c.user_turn_number == user_turn_number)
        query = query.order_by(u.c.user_turn_number)

        def as_dict(row: Sequence[Any]) -> dict[str, Any]:
            return {
                "user_turn_number": row[0],
                "requests": int(row[1]),
                "input_tokens": int(row[2]),
                "output_tokens": int(row[3]),
                "total_tokens": int(row[4]),
                "input_tokens_details": _loads(row[5]),
                "output_tokens_details": _loads(row[6]),
            }

        async def body(conn: AsyncConnection) -> list[dict[str, Any]] | dict[str, Any]:
            rows = (await conn.execute(query, await self._bind_branch(conn, branch_id))).all()
            if user_turn_number is None:
                return [as_dict(r) for r in rows]
            if not rows:
                return {}
            one = as_dict(rows[0])
            del one["user_turn_number"]
            return one

        return await self._read(body, {} if user_turn_number is not None else [])

    # -- turns ----------------------------------------------------------------------------------

    def _user_turns(self) -> Any:  # noqa: ANN401 - a Select, on the bound ``_BRANCH``
        m, s = self._backend.st.messages, self._structure
        # The time as the driver gives it (SQLite: text), not parsed into a datetime per row
        # only to be formatted back: a third of the time of 10,000 turns.
        created = type_coerce(s.c.created_at, String())
        return (
            select(s.c.branch_turn_number, m.c.message_data, created)
            .join(m, _holds(s, m))
            .where(self._where(bindparam(_BRANCH)), s.c.message_type == "user")
            .order_by(s.c.branch_turn_number)
        )

    async def get_conversation_turns(self, branch_id: str | None = None) -> list[dict[str, Any]]:
        """The user turns of the current branch (or ``branch_id``): where one can branch from.

        Each: ``turn``, ``content`` (first 100 characters), ``full_content``,
        ``timestamp``, ``can_branch``.
        """
        self._branch_of(branch_id)  # checked before any read
        query = self._user_turns()

        async def body(conn: AsyncConnection) -> list[dict[str, Any]]:
            turns = []
            branch = await self._bind_branch(conn, branch_id)
            for turn, data, created_at in (await conn.execute(query, branch)).all():
                text = self._open(data, f"of turn {turn}")  # the typed error if it cannot
                try:
                    content = json.loads(text).get("content", "")  # type: ignore[arg-type]
                except (ValueError, TypeError, AttributeError):
                    continue
                turns.append(
                    {
                        "turn": turn,
                        "content": _preview(content, 100),
                        "full_content": content,
                        "timestamp": _timestamp(created_at),
                        "can_branch": True,
                    }
                )
            return turns

        return await self._read(body, [])

    async def find_turns_by_content(
        self, search_term: str, branch_id: str | None = None
    ) -> list[dict[str, Any]]:
        """User turns whose text contains ``search_term`` (ASCII letters in any case).

        Any text works, accents and emoji included, whether the items were
        stored with ``ensure_ascii`` or not (rows the SDK wrote escape them).
        On a plaintext store the database narrows the turns down first (``LIKE``);
        encrypted items can only be searched once opened, so on an encrypted
        store every user turn of the branch is read and opened here, and the same
        match decides.
        """
        if not isinstance(search_term, str):
            msg = f"search_term must be a str, got {type(search_term).__name__}"
            raise TypeError(msg)
        m = self._backend.st.messages
        self._branch_of(branch_id)  # checked before any read
        query = self._user_turns()
        if self._backend.keyring is None:
            forms = {
                json.dumps(search_term)[1:-1],
                json.dumps(search_term, ensure_ascii=False)[1:-1],
            }
            query = query.where(
                or_(*(m.c.message_data.icontains(f, autoescape=True) for f in forms))
            )
        pattern = re.compile(re.escape(search_term), re.IGNORECASE | re.ASCII)

        async def body(conn: AsyncConnection) -> list[dict[str, Any]]:
            found = []
            branch = await self._bind_branch(conn, branch_id)
            for turn, data, created_at in (await conn.execute(query, branch)).all():
                text = self._open(data, f"of turn {turn}")  # the typed error if it cannot
                try:
                    content = json.loads(text).get("content", "")  # type: ignore[arg-type]
                    texts = (
                        [content]
                        if isinstance(content, str)
                        else [part.get("text", "") for part in content]
                    )
                except (ValueError, TypeError, AttributeError):
                    continue
                if not any(isinstance(t, str) and pattern.search(t) for t in texts):
                    continue
                found.append(
                    {
                        "turn": turn,
                        "content": _preview(content),
                        "full_content": content,
                        "timestamp": _timestamp(created_at),
                        "can_branch": True,
                    }
                )
            return found

        return await self._read(body, [])

    async def get_conversation_by_turns(
        self, branch_id: str | None = None
    ) -> dict[int, list[dict[str, str | None]]]:
        """Each turn's items (``type`` and ``tool_name``) in order, by user turn number."""
        s = self._structure
        self._branch_of(branch_id)  # checked before any read
        query = (
            select(s.c.user_turn_number, s.c.message_type, s.c.tool_name)
            .where(self._where(bindparam(_BRANCH)))
            .order_by(s.c.sequence_number)
        )

        async def body(conn: AsyncConnection) -> dict[int, list[dict[str, str | None]]]:
            turns: dict[int, list[dict[str, str | None]]] = {}
            branch = await self._bind_branch(conn, branch_id)
            for turn, kind, tool in (await conn.execute(query, branch)).all():
                turns.setdefault(turn, []).append({"type": kind, "tool_name": tool})
            return turns

        return await self._read(body, {})

    async def get_tool_usage(self, branch_id: str | None = None) -> list[tuple[str, int, int]]:
        """``(tool_name, calls, turn)`` for each tool used in each turn, in turn order."""
        s = self._structure
        self._branch_of(branch_id)  # checked before any read
        query = (
            select(s.c.message_type, s.c.tool_name, s.c.user_turn_number)
            .where(
                self._where(bindparam(_BRANCH)),
                s.c.message_type.in_([*TOOL_CALL_TYPES, "tool_search_output"]),
            )
            .order_by(s.c.sequence_number)
        )

        async def body(conn: AsyncConnection) -> list[tuple[str, int, int]]:
            rows = (await conn.execute(query, await self._bind_branch(conn, branch_id))).all()
            searched = {
                (turn, tool) for kind, tool, turn in rows if kind == "tool_search_call" and tool
            }
            counts: dict[tuple[int, str | None], int] = {}
            for kind, tool, turn in rows:
                if kind == "tool_search_output":
                    if (turn, tool) in searched or tool is None:
                        continue  # counted with its call (the SDK's rule)
                    name: str | None = tool
                elif tool is None and kind in ("shell_call", "apply_patch_call"):
                    name = kind
                else:
                    name = tool
                counts[turn, name] = counts.get((turn, name), 0) + 1
            return [
                (name, n, turn)  # type: ignore[misc]
                for (turn, name), n in sorted(counts.items(), key=lambda kv: kv[0][0] or 0)
            ]

        return await self._read(body, [])

    # -- branches -------------------------------------------------------------------------------

    async def _reserve(self, conn: AsyncConnection, name: str | None, turn: int) -> str:
        """Claim a branch name never used in this session (under the session's lock)."""
        b, s = self._branches, self._structure

        async def used(candidate: str) -> bool:
            query = select(
                or_(
                    exists(
                        select(b.c.branch_id).where(
                            b.c.session_id == self.session_id, b.c.branch_id == candidate
                        )
                    ),
                    exists(select(s.c.sequence_number).where(self._where(candidate))),
                )
            )
            return bool((await conn.execute(query)).scalar())

        if name is not None:
            if await used(name):
                msg = f"Branch ID '{name}' has already been used. Choose a new branch ID."
                raise ValueError(msg)
            chosen = name
        else:
            base = f"branch_from_turn_{turn}_{int(time.time())}"
            chosen, suffix = base, 1
            while await used(chosen):
                suffix += 1
                chosen = f"{base}_{suffix}"
        await conn.execute(insert(b).values(session_id=self.session_id, branch_id=chosen))
        return chosen

    async def create_branch_from_turn(
        self, turn_number: int, branch_name: str | None = None
    ) -> str:
        """A new branch holding the turns before ``turn_number``; it becomes the current one.

        The branch shares those items with its source (no copies of the items
        themselves); continuing either branch leaves the other as it is.

        Raises:
            ValueError: the turn has no user message on the current branch, or
                ``branch_name`` is blank or has been used in this session.

        """
        if isinstance(turn_number, bool) or not isinstance(turn_number, int):
            msg = f"turn_number must be an int, got {type(turn_number).__name__}"
            raise TypeError(msg)
        if branch_name is not None:
            _validate_branch_id(branch_name, "branch_name")
            if not branch_name.strip():
                msg = "Branch name cannot be empty"
                raise ValueError(msg)
        state, clears = (self._branch, self._generation), self._clears
        s = self._structure
        copied = (
            s.c.message_position,
            s.c.message_type,
            s.c.user_turn_number,
            s.c.branch_turn_number,
            s.c.tool_name,
        )

        async def body(conn: AsyncConnection) -> tuple[str, str, int]:
            await self._lock_session(conn)
            source = await self._resolve(conn, state)
            found = (
                await conn.execute(
                    select(s.c.sequence_number).where(
                        self._where(source),
                        s.c.branch_turn_number == turn_number,
                        s.c.message_type == "user",
                    )
                )
            ).first()
            if found is None:
                msg = f"Turn {turn_number} does not contain a user message in branch '{source}'"
                raise ValueError(msg)
            name = await self._reserve(conn, branch_name, turn_number)
            rows = (
                await conn.execute(
                    select(*copied)
                    .where(self._where(source), s.c.branch_turn_number < turn_number)
                    .order_by(s.c.sequence_number)
                )
            ).all()
            if rows:
                seq = (
                    await conn.execute(
                        select(func.coalesce(func.max(s.c.sequence_number), 0)).where(
                            s.c.session_id == self.session_id
                        )
                    )
                ).scalar_one()
                await conn.execute(
                    insert(s),
                    [
                        {
                            "session_id": self.session_id,
                            "branch_id": name,
                            "sequence_number": int(seq) + i + 1,
                            **row._asdict(),
                        }
                        for i, row in enumerate(rows)
                    ],
                )
            return name, source, await self._generation_now(conn)

        name, source, generation = await self._write(body)
        self._choose(name, generation, clears)
        self._logger.debug("created branch %r from turn %s of %r", name, turn_number, source)
        return name

    async def create_branch_from_content(
        self, search_term: str, branch_name: str | None = None
    ) -> str:
        """Branch from the first user turn (of the current branch) containing ``search_term``."""
        matches = await self.find_turns_by_content(search_term)
        if not matches:
            msg = f"No user turns found containing '{search_term}'"
            raise ValueError(msg)
        return await self.create_branch_from_turn(matches[0]["turn"], branch_name)

    async def switch_to_branch(self, branch_id: str) -> None:
        """Make ``branch_id`` the current branch; ``ValueError`` if it has no items.

        The session's clear generation is read with the branch: a clear by another
        object after this sends this object back to ``main`` (see the module). One
        this object finishes while the switch runs wins: it stays on ``main``.
        """
        branch = _validate_branch_id(branch_id)
        s = self._structure
        query = select(exists(select(s.c.sequence_number).where(self._where(branch))))
        clears = self._clears

        async def body(conn: AsyncConnection) -> tuple[bool, int]:
            found = bool((await conn.execute(query)).scalar())
            return found, await self._generation_now(conn) if found else 0

        found, generation = await self._read(body, empty=(False, 0))
        if not found:
            msg = f"Branch '{branch_id}' does not exist"
            raise ValueError(msg)
        self._choose(branch, generation, clears)

    async def delete_branch(self, branch_id: str, force: bool = False) -> None:
        """Delete a branch: its turns, its usage and the items no other branch holds.

        ``main`` cannot be deleted; the current branch only with ``force=True``
        (the session moves to ``main``). The name stays used in this session.
        """
        if not isinstance(branch_id, str) or not branch_id.strip():
            msg = "Branch ID cannot be empty"
            raise ValueError(msg)
        _validate_branch_id(branch_id)
        if branch_id == MAIN:
            msg = "Cannot delete the 'main' branch"
            raise ValueError(msg)
        if branch_id == self._branch:
            if not force:
                msg = (
                    f"Cannot delete current branch '{branch_id}'. "
                    "Use force=True or switch branches first"
                )
                raise ValueError(msg)
            if not any(b["branch_id"] == branch_id for b in await self.list_branches()):
                msg = f"Branch '{branch_id}' does not exist"
                raise ValueError(msg)
            await self.switch_to_branch(MAIN)
        sid, s = self.session_id, self._structure

        async def body(conn: AsyncConnection) -> None:
            live = await self._lock_existing(conn)  # an expired session has no branch
            mine = self._where(branch_id)
            query = select(exists(select(s.c.sequence_number).where(mine)))
            if not (live and (await conn.execute(query)).scalar()):
                msg = f"Branch '{branch_id}' does not exist"
                raise ValueError(msg)
            await self._drop_branch(conn, branch_id)

        await self._write(body)
        self._logger.info("deleted branch %r of %r", branch_id, sid)

    async def list_branches(self) -> list[dict[str, Any]]:
        """Every branch with items: ``branch_id``, ``message_count``, ``user_turns``,
        ``is_current``, ``created_at``; oldest first.
        """  # noqa: D205
        s = self._structure
        first = func.min(s.c.created_at)
        query = (
            select(
                s.c.branch_id,
                func.count(),
                func.sum(case((s.c.message_type == "user", 1), else_=0)),
                first,
            )
            .where(s.c.session_id == self.session_id)
            .group_by(s.c.branch_id)
            .order_by(first, func.min(s.c.sequence_number))
        )

        async def body(conn: AsyncConnection) -> list[dict[str, Any]]:
            current = await self._branch_for(conn, None)
            return [
                {
                    "branch_id": branch,
                    "message_count": int(count),
                    "user_turns": int(users or 0),
                    "is_current": branch == current,
                    "created_at": _timestamp(created),
                }
                for branch, count, users, created in (await conn.execute(query)).all()
            ]

        return await self._read(body, [])


class AdvancedSQLiteSession(AdvancedSQLAlchemySession):
    """The Agents SDK's ``AdvancedSQLiteSession``, constructor and all, over our tables.

    Switch by changing the import: ``AdvancedSQLiteSession(session_id=...,
    db_path=..., create_tables=True)``. A new file (or ``:memory:``) gets the
    schema whatever ``create_tables`` says; an existing file is migrated only
    with ``create_tables=True`` (or ``agents-memory db upgrade``), which also
    adopts the branches and usage rows the SDK's class wrote there.
    ``close()`` is synchronous, as the SDK's is (``aclose()`` inside a loop).
    """

    def __init__(
        self,
        *,
        session_id: str,
        db_path: str | Path = ":memory:",
        create_tables: bool = False,
        logger: logging.Logger | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
        sessions_table: str | None = None,
        messages_table: str | None = None,
        ttl: dt.timedelta | None = None,
    ) -> None:
        if not isinstance(db_path, str | Path):
            msg = f"db_path must be a str or Path, got {type(db_path).__name__}"
            raise TypeError(msg)
        self.db_path = db_path
        memory = str(db_path) == ":memory:"
        fresh = memory or not Path(db_path).exists()
        url = URL.create("sqlite+aiosqlite", database=None if memory else str(db_path))
        engine = create_engine(url)
        try:
            super().__init__(
                session_id,
                engine=engine,
                create_tables=create_tables or fresh,
                sessions_table=sessions_table,
                messages_table=messages_table,
                session_settings=session_settings,
                logger=logger,
                ttl=ttl,
            )
        except BaseException:
            engine.sync_engine.dispose(close=False)
            raise
        self._backend.own_engine(f"{type(self).__name__} {session_id!r}")
        self.sessions_table = self._backend.names.sessions
        self.messages_table = self._backend.names.messages
        self._closing: asyncio.Task[None] | None = None

    async def aclose(self) -> None:
        """Close the session and its engine (what ``close()`` starts)."""
        await SQLAlchemySession.close(self)

    def close(self) -> None:  # type: ignore[override]  # the SDK's close() is synchronous
        """Close the session and its engine; later calls raise ``SessionClosedError``.

        Outside an event loop the engine is closed before this returns; inside
        one, the closing is scheduled on it (``await session.aclose()`` to wait).
        """
        if self._closed:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            asyncio.run(self.aclose())
            return
        self._closed = True
        self._closing = loop.create_task(SQLAlchemySession.close(self))

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
