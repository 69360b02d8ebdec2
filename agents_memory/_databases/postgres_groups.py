"""Group commit for appends on Postgres: with the pool saturated, queued batches share a statement.

Measured before it was built (``benchmarks/README.md``, "Grouping on Postgres"): one
statement appending several sessions' batches got 1.5-1.7x the throughput of one
statement per batch at 32-64 concurrent writers, 2.7-3.3x through PgBouncer (where
every statement costs its round trips once per group instead of once per batch).

**Group only when the pool is saturated, per engine, table-name set and event loop.**
The appender has as many *slots* as the loop's driver pool has connections
(``pool.engine_pool_size``, the size ``DriverRunner`` gives its ``DriverPool``). An
append that finds a free slot runs today's one-session statement at once, in its own
task, on a pooled connection of its own: with free connections nothing groups, and no
append waits for another's locks. Only when every slot holds an append in flight do
arriving appends queue. When any append in flight (alone or a group) ends and the
queue is not empty, its slot goes on to a *leader* task that sends everything queued
(up to :data:`GROUP_MAX_BATCHES` and :data:`GROUP_MAX_BYTES`) as one statement, then
the next group, until the queue is empty; then the slot is free again. So several
group statements may be in flight at once, each on its own connection, and never more
appends than the pool has connections: exactly where, without grouping, the queued
appends would have waited for a connection one batch at a time, they go out together.
A queued batch not sent within :data:`GROUP_MAX_WAIT` (every slot waits on a row lock)
leaves the queue and goes alone, as without grouping.

**The group statement** (:func:`group_append`) is built with Core from the model
tables and compiled once per table-name set. It upserts the sessions in
``session_id`` order, bumps each counter by its merged batch size, drops an expired
session's old items as the single statement does, and numbers every row below its
session's bumped counter. A group's batches to one session are merged in arrival
order, so each batch stays contiguous.

**No deadlock between appends.** Every group takes its session row locks in one global
order (``session_id``), so groups in flight at once wait on each other only along that
order, never in a cycle. A single append locks one session row only: it holds nothing
while it waits for that lock, and once it holds it, it touches only that session's
items, which a group reaches only after locking the same row. So a single append
cannot close a cycle with groups either. (Prune's pages lock in ``session_id`` order
too.)

**Per caller:** its batch is atomic and contiguous; it returns once the statement
holding it committed. A group the server rejects (an error of the statement, not
of the connection) is run again batch by batch, so only the bad batch's caller
gets the error; a lost connection gives every caller of the group that error
(the outcome is unknown for all of them, as for one statement). A cancel
withdraws a batch not yet sent; a batch already sent cannot be withdrawn, so its
caller waits for the outcome, then raises the cancel.

On by default (see :func:`grouping_on`); off with the engine execution option
``agents_memory_group_commit=False`` (the same switch as SQLite's group commit);
legacy tables (no positions) never group.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import threading
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import asyncpg
from sqlalchemy import BigInteger, String, Text, bindparam, cast, func, insert, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.sql.expression import Insert

from agents_memory._databases.base import (
    CompiledSQL,
    Row,
    compile_for,
    expired,
    group_commit_option,
    renewed_expiry,
    tables_for,
)
from agents_memory._tables import TableNames

GROUP_MAX_BATCHES = 64
"""The most callers' batches one group statement holds.

64 covers a 64-session burst in one or two statements; the measured gain was
most of what a whole burst in one statement allows (2.1x direct) already at
groups of 13 batches on average.
"""

GROUP_MAX_BYTES = 4 * 1024 * 1024
"""The most encoded item characters one group statement carries (a bigger batch goes alone).

Bounds the statement's parameters (and so its memory and the time it holds its
sessions' row locks) whatever the batches weigh.
"""

GROUP_MAX_WAIT: float | None = 0.2
"""Seconds a queued batch waits to be sent before it leaves the queue and goes alone.

A batch queues only when every slot (pooled connection) holds an append in flight;
if all of them wait on row locks (long transactions holding their sessions, a prune's
page), the queue waits with them. A queued batch not sent within this time is
withdrawn and sent by its own caller as today's statement, waiting for the next free
pooled connection as it would without grouping, so it never joins a group held up by
a lock. A group normally goes within a few milliseconds; a batch already sent keeps
waiting for its statement. ``None``: no limit.
"""

GROUP_KEY = "append_group"
"""The group statement's key among a runner's compiled statements."""

RunStatement = Callable[[str, Mapping[str, Any]], Awaitable[Sequence[Row]]]
"""Run one compiled statement (by key) as its own transaction; errors wrapped as SQLAlchemy's."""


def group_append(names: TableNames) -> Insert:
    """The multi-session append, with the single append's semantics for each session.

    Parameters (arrays, one entry per session of the group, sorted by id): ``sids``,
    ``ns`` (rows it appends), ``exps`` (its new deadline or ``NULL``: keep); and per
    row: ``owners`` (its session), ``backs`` (how far below the session's new
    counter it lands: 0 for the session's last row) and ``rows`` (the encoded item).
    """
    sessions, messages = tables_for(names, head=True)
    clock = func.timezone("UTC", func.current_timestamp())
    now = func.current_timestamp()
    sid_type = String()  # unbounded: a too-long id fails its insert (as alone), never truncated
    given = (
        func.unnest(
            cast(bindparam("sids"), postgresql.ARRAY(sid_type)),
            cast(bindparam("ns"), postgresql.ARRAY(BigInteger())),
            cast(bindparam("exps"), postgresql.ARRAY(sessions.c.expires_at.type)),
        )
        .table_valued("sid", "n", "exp")
        .render_derived(name="g")
    )
    g = select(given.c.sid, given.c.n, given.c.exp).cte("g")
    upsert: Any = postgresql.insert(sessions).from_select(
        ["session_id", "expires_at", "last_position"],
        # Row locks taken in this order: session_id order, as every group's.
        select(g.c.sid, g.c.exp, g.c.n).order_by(g.c.sid),
    )
    upsert = upsert.on_conflict_do_update(
        index_elements=[sessions.c.session_id],
        set_={
            "updated_at": now,
            "expires_at": renewed_expiry(sessions, clock, upsert.excluded.expires_at),
            "last_position": sessions.c.last_position + upsert.excluded.last_position,
        },
    ).returning(sessions.c.session_id, sessions.c.last_position)
    s = upsert.cte("s")
    # The expired sessions' old items, as the single statement's ``x``: the statement's
    # snapshot (the rows as they were before this write; never the items it inserts),
    # ordered after the upsert by the count (it waits for every row lock first).
    all_locked = select(func.count()).select_from(s).scalar_subquery() == func.cardinality(
        cast(bindparam("sids"), postgresql.ARRAY(sid_type))
    )
    was_expired = select(sessions.c.session_id).where(
        sessions.c.session_id.in_(select(g.c.sid)), expired(sessions, clock)
    )
    dropped = messages.delete().where(messages.c.session_id.in_(was_expired), all_locked).cte("x")
    rows = (
        func.unnest(
            cast(bindparam("owners"), postgresql.ARRAY(sid_type)),
            cast(bindparam("backs"), postgresql.ARRAY(BigInteger())),
            cast(bindparam("rows"), postgresql.ARRAY(Text())),
        )
        .table_valued("sid", "back", "d", with_ordinality="o")
        .render_derived(name="r")
    )
    numbered = (
        select(rows.c.sid, s.c.last_position - rows.c.back, rows.c.d)
        .select_from(rows.join(s, s.c.session_id == rows.c.sid))
        .order_by(rows.c.o)
    )
    return (
        insert(messages)
        .from_select(["session_id", "position", "message_data"], numbered)
        .add_cte(g, s, dropped)
    )


@functools.cache
def compiled_group(names: TableNames, dialect: Dialect) -> CompiledSQL:
    """The group statement of ``names``, compiled once per table-name set and dialect."""
    return compile_for(group_append(names), dialect)


def group_params(batches: Sequence[_Batch]) -> dict[str, Any]:
    """The group statement's parameters: batches merged per session in arrival order."""
    merged: dict[str, list[_Batch]] = {}
    for b in batches:
        merged.setdefault(b.sid, []).append(b)
    sids = sorted(merged)
    ns: list[int] = []
    exps: list[object] = []
    owners: list[str] = []
    backs: list[int] = []
    rows: list[str] = []
    for sid in sids:
        mine = merged[sid]
        total = sum(len(b.data) for b in mine)
        ns.append(total)
        # One after another, each write keeps the deadline unless it gives one: the last given.
        exps.append(next((b.expires for b in reversed(mine) if b.expires is not None), None))
        owners += [sid] * total
        backs += range(total - 1, -1, -1)
        for b in mine:
            rows += b.data
    return {"sids": sids, "ns": ns, "exps": exps, "owners": owners, "backs": backs, "rows": rows}


class _Batch:
    """One caller's append, queued: its session, rows, deadline and the future it awaits.

    ``sent`` is set by the leader just before the statement holding the batch is
    sent, ``withdrawn`` by a caller cancelled before that; both run on the loop,
    so whichever comes first wins (no lock). Its caller awaits the future shielded,
    so only the leader ever completes it.
    """

    __slots__ = ("data", "expires", "future", "sent", "sid", "size", "withdrawn")

    def __init__(
        self, sid: str, data: list[str], expires: object, future: asyncio.Future[None]
    ) -> None:
        self.sid = sid
        self.data = data
        self.expires = expires
        self.future = future
        self.size = sum(map(len, data))
        self.sent = False
        self.withdrawn = False


def _settle(batch: _Batch, error: BaseException | None) -> None:
    """Hand a batch its outcome (a cancel of the leader itself cancels it)."""
    if not batch.future.done():
        if error is None:
            batch.future.set_result(None)
        elif isinstance(error, asyncio.CancelledError):
            batch.future.cancel()
        else:
            batch.future.set_exception(error)


def _server_rejected(exc: BaseException) -> bool:
    """The server refused the statement; the connection is fine, nothing of it was applied."""
    return (
        isinstance(exc, DBAPIError)
        and not exc.connection_invalidated
        and isinstance(exc.orig, asyncpg.PostgresError)
    )


class GroupedAppender:
    """The appends of one engine, table-name set and event loop (see the module docstring).

    ``slots``: how many appends may be in flight at once, the loop's driver pool size
    (more would only wait for a connection). Below it an append goes alone; at it,
    appends queue and go out in groups as slots free up.
    """

    def __init__(
        self,
        *,
        slots: int,
        max_batches: int = GROUP_MAX_BATCHES,
        max_bytes: int = GROUP_MAX_BYTES,
    ) -> None:
        self.slots = max(1, slots)
        self.max_batches = max_batches
        self.max_bytes = max_bytes
        self._in_flight = 0
        """Slots taken: appends alone plus leaders (each sending one statement at a time)."""
        self._queue: collections.deque[_Batch] = collections.deque()
        self._leaders: set[asyncio.Task[None]] = set()  # (referenced until done)
        self._groups_in_flight = 0
        self.alone = 0
        """Appends sent at once, alone, on a free slot (benchmarks, tests)."""
        self.groups: collections.Counter[int] = collections.Counter()
        """Statements sent by leaders, by how many batches each held (benchmarks, tests)."""
        self.most_groups_in_flight = 0
        """The most leaders' statements in flight at one time (benchmarks, tests)."""
        self.fallbacks = 0
        """Groups the server rejected, run again batch by batch."""
        self.escaped = 0
        """Batches that waited :data:`GROUP_MAX_WAIT` unsent and went alone."""

    async def add(self, run: RunStatement, sid: str, data: list[str], expires: object) -> None:
        """Append one batch; returns once the statement holding it has committed.

        ``run`` sends a statement through the caller's runner (any runner of this
        engine and table set sends the same statements on the same pool).
        """
        if self._in_flight < self.slots:  # a free connection: today's statement, at once
            self._in_flight += 1
            self.alone += 1
            try:
                await run("append", append_params(sid, data, expires))
            finally:
                self._next(run)
            return
        batch = _Batch(sid, data, expires, asyncio.get_running_loop().create_future())
        self._queue.append(batch)
        try:
            try:
                # Shielded: a cancel of this caller must not cancel the outcome the leader sets.
                await asyncio.wait_for(asyncio.shield(batch.future), GROUP_MAX_WAIT)
            except TimeoutError:
                if batch.sent:  # sent just now, or its statement is slow: wait for it
                    await asyncio.shield(batch.future)
                    return
                batch.withdrawn = True  # held up (every slot waits on a lock)
                self.escaped += 1
                await run("append", append_params(sid, data, expires))
        except asyncio.CancelledError:
            if not batch.sent:
                batch.withdrawn = True  # never sent: the leaders skip it
                raise
            await _outcome(batch.future)  # sent: it cannot be withdrawn; wait for it
            raise

    def _next(self, run: RunStatement) -> None:
        """An append alone has ended: its slot leads what queued meanwhile, or is freed."""
        if self._queue:
            leader = asyncio.get_running_loop().create_task(self._lead(run))
            self._leaders.add(leader)
            leader.add_done_callback(self._leaders.discard)
        else:
            self._in_flight -= 1

    def _take(self) -> list[_Batch]:
        """The next group: queued batches in order, within the caps (the first always)."""
        group: list[_Batch] = []
        size = 0
        while self._queue and len(group) < self.max_batches:
            b = self._queue[0]
            if b.withdrawn:
                self._queue.popleft()
                continue
            if group and size + b.size > self.max_bytes:
                break
            self._queue.popleft()
            group.append(b)
            size += b.size
        return group

    async def _lead(self, run: RunStatement) -> None:
        """On one slot, send queued groups one statement at a time until the queue is empty.

        Other slots' leaders take from the same queue meanwhile, each its own group.
        """
        try:
            while group := self._take():
                for b in group:
                    b.sent = True
                self.groups[len(group)] += 1
                self._groups_in_flight += 1
                self.most_groups_in_flight = max(self.most_groups_in_flight, self._groups_in_flight)
                try:
                    await self._send(run, group)
                finally:
                    self._groups_in_flight -= 1
        except BaseException as exc:  # the loop is shutting down: nobody is left waiting
            for b in [*self._queue]:
                _settle(b, exc)
            self._queue.clear()
            raise
        finally:
            self._in_flight -= 1

    async def _send(self, run: RunStatement, group: list[_Batch]) -> None:
        try:
            if len(group) == 1:
                b = group[0]
                await run("append", append_params(b.sid, b.data, b.expires))
            else:
                await run(GROUP_KEY, group_params(group))
        except Exception as exc:  # noqa: BLE001 - handed to the group's callers
            if len(group) > 1 and _server_rejected(exc):
                self.fallbacks += 1
                await self._alone(run, group)
                return
            for b in group:  # lost or unknown: the same outcome for every batch of it
                _settle(b, exc)
            return
        except BaseException as exc:
            for b in group:
                _settle(b, exc)
            raise
        for b in group:
            _settle(b, None)

    async def _alone(self, run: RunStatement, group: list[_Batch]) -> None:
        """Each batch of a rejected group in its own statement, in arrival order."""
        for b in group:
            try:
                await run("append", append_params(b.sid, b.data, b.expires))
            except Exception as exc:  # noqa: BLE001 - handed to that batch's caller
                _settle(b, exc)
            else:
                _settle(b, None)


def append_params(sid: str, data: Sequence[str], expires: object) -> dict[str, Any]:
    """The one-session ``append`` statement's parameters (the runner's, and each group's alone)."""
    return {"sid": sid, "data": list(data), "expires": expires, "n": len(data)}


async def _outcome(future: asyncio.Future[None]) -> None:
    """Wait until a sent batch's outcome is in, whatever it is and however often cancelled."""
    while not future.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(future)
    if not future.cancelled():
        future.exception()  # retrieved: the caller asked to be cancelled, not for the outcome


class _Appenders:
    """The :class:`GroupedAppender` of each event loop for one engine and table-name set."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        """Each loop's appender's slots: the engine's driver pool size per loop."""
        self.by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, GroupedAppender] = (
            weakref.WeakKeyDictionary()
        )

    def current(self) -> GroupedAppender:
        """The running loop's appender (made on first use; loops may run on several threads)."""
        loop = asyncio.get_running_loop()
        found = self.by_loop.get(loop)  # (the usual case: no lock)
        if found is None:
            with _guard:
                found = self.by_loop.get(loop)
                if found is None:
                    found = self.by_loop[loop] = GroupedAppender(slots=self.slots)
        return found


_registry: weakref.WeakKeyDictionary[Engine, dict[TableNames, _Appenders]] = (
    weakref.WeakKeyDictionary()
)
_guard = threading.Lock()


def grouping_on(engine: AsyncEngine) -> bool:
    """Whether the engine's ``agents_memory_group_commit`` option leaves grouping on (default on).

    A group is one statement, so a session whose row is locked (a replace of a long
    history, a prune's page, a transaction of the application's) holds up every batch
    sent in its group, other sessions' included. It is still safe on by default because
    a group forms only when every pooled connection of the loop already holds an
    append: there, without grouping, the same batches would wait for a connection
    anyway (behind the same statements), while an append that finds a free connection
    goes alone and waits for nobody's locks. A held-up group holds one connection; the
    others keep serving appends. ``GROUP_MAX_WAIT`` bounds the wait of batches not yet
    sent.
    """
    return group_commit_option(engine, default=True)


def appenders_for(engine: AsyncEngine, names: TableNames, *, slots: int) -> _Appenders:
    """The per-loop appenders of ``engine`` and ``names``, shared by every store on them.

    Shared, so that two stores on one engine and table set share the loop's slots
    (``slots``: its driver pool size; their groups are one queue).
    """
    with _guard:
        per_engine = _registry.get(engine.sync_engine)
        if per_engine is None:
            per_engine = _registry[engine.sync_engine] = {}
        found = per_engine.get(names)
        if found is None:
            found = per_engine[names] = _Appenders(slots)
        return found
