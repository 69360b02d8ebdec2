"""The Agents SDK's partial-compaction hook, ``_get_compaction_snapshot``, on our sessions.

The SDK's ``Runner`` (0.24), compacting automatically through
``OpenAIResponsesCompactionSession``, asks the wrapped session for
``_get_compaction_snapshot(limit, *, prune_prefix=None)``: the newest ``limit``
items (oldest first), whether they are the whole history, and a
``replace_suffix(start, output)`` that swaps the items from ``start`` on for the
compacted ``output`` and says whether it did. The SDK's own SQL sessions offer it;
so do ours, with the same answers, and each swap is one transaction that first
checks, under the session's write lock, that the suffix is still exactly what the
snapshot read (the same row ids holding the same data, and nothing after them).
An append, pop, clear or replace since the read makes it return ``False`` and
change nothing, as the SDK's protocol defines; of two swaps of one snapshot, one
wins.

``prune_prefix`` (what the SDK's ``EncryptedSession`` passes: "is this envelope
expired") deletes, in the same transaction, the run of oldest items it accepts,
stopping at the first it refuses or that cannot be decoded: a row the keyring
cannot open is never deleted.

The statements are portable Core built from the models; ``SQLAlchemySession``
runs them through its backend's transaction (whichever database, whichever
runner serves its other operations), the stdlib ``SQLiteSession`` compiles them
for ``sqlite3`` and runs them in its write transaction (grouped with other writes
on the file, in a savepoint of its own). The snapshot's return type is ours, with
the SDK's attribute names (the SDK's class is private).
"""

from __future__ import annotations

import dataclasses
import functools
import sqlite3
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Executable, bindparam, delete, select
from sqlalchemy.ext.asyncio import AsyncConnection

from agents_memory._codec import decode_row, encode_items
from agents_memory._databases.base import (
    CompiledSQL,
    Statements,
    compile_for,
    numbered,
    order_key,
    tables_for,
    upsert_counting,
)
from agents_memory._errors import CorruptItemError, DecryptionError
from agents_memory._ids import check_sql_int
from agents_memory._sqlalchemy._cancel import run_to_completion
from agents_memory._tables import TableNames

if TYPE_CHECKING:
    from agents_memory._crypto import Keyring
    from agents_memory._protocol import TResponseInputItem
    from agents_memory._sqlalchemy._backend import Backend

PrunePrefix = Callable[[Any], bool]
Row = tuple[int, Any]
"""``(id, message_data)`` as read: what a swap compares the current suffix against."""


@dataclasses.dataclass(frozen=True, slots=True)
class CompactionSnapshot:
    """The newest items, whether they are all of them, and the atomic suffix swap.

    The attribute names are the SDK's (``agents.memory.session._CompactionSnapshot``).
    """

    items: list[TResponseInputItem]
    complete: bool
    replace_suffix: Callable[[int, list[TResponseInputItem]], Awaitable[bool]]


class _Stale(Exception):  # noqa: N818 - a signal, not an error anyone sees
    """The suffix changed since the snapshot: roll the transaction back, report ``False``."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Statements:
    """The hook's own statements; the tail is read with the session's ``select_latest``.

    (That one, from the database module's variant in force, hides an expired session,
    so a snapshot of one is empty and a swap on one is stale.)
    """

    prefix: Executable
    """Up to ``n`` rows above ``after`` and below ``first``, oldest first, locked."""
    delete_upto: Executable
    """A session's rows up to ``upto``: the expired prefix (``sid``, ``upto``)."""
    delete_from: Executable
    """A session's rows from ``first`` on: the suffix being swapped (``sid``, ``first``)."""


@functools.cache
def statements(names: TableNames, head: bool = True) -> _Statements:
    """The hook's statements for a name set and variant, from the models (built once).

    Rows are compared and cut by the session's order key: ``position`` at head,
    ``id`` on legacy tables.
    """
    _, m = tables_for(names, head)
    key = order_key(m)
    sid = bindparam("sid", type_=m.c.session_id.type)
    mine = m.c.session_id == sid
    return _Statements(
        prefix=select(key, m.c.message_data)
        .where(mine, key > bindparam("after"), key < bindparam("first"))
        .order_by(key)
        .limit(bindparam("n"))
        .with_for_update(),
        delete_upto=delete(m).where(mine, key <= bindparam("upto")),
        delete_from=delete(m).where(mine, key >= bindparam("first")),
    )


def check_limit(limit: object) -> int:
    """The snapshot's ``limit``: a positive int (the SDK asks for at least one item)."""
    if isinstance(limit, bool) or not isinstance(limit, int):
        msg = f"limit must be an int, got {type(limit).__name__}"
        raise TypeError(msg)
    if limit < 1:
        msg = f"limit must be >= 1, got {limit}"
        raise ValueError(msg)
    check_sql_int("limit", limit + 1)
    return limit


def decode_tail(
    fetched: Sequence[Sequence[Any]], limit: int, keyring: Keyring | None
) -> tuple[list[Row], list[Any], bool] | None:
    """``(rows oldest first, their items, complete)`` from ``limit + 1`` newest-first rows.

    ``None`` (no snapshot: the SDK then falls back to its whole-history path) when a
    row is not a JSON object or cannot be opened, as the SDK's sessions decline on
    a row they cannot decode.
    """
    complete = len(fetched) <= limit
    rows = [(int(r[0]), r[1]) for r in reversed(fetched[:limit])]
    try:
        items = [decode_row(d, row_id=i, on_corrupt="raise", keyring=keyring) for i, d in rows]
    except (CorruptItemError, DecryptionError):
        return None
    return rows, items, complete


def _expired_run(
    batch: Sequence[Sequence[Any]], prune_prefix: PrunePrefix, keyring: Keyring | None
) -> int | None:
    """The key of the last row of the leading run of ``batch`` that ``prune_prefix`` accepts."""
    last = None
    for row_id, data in batch:
        try:
            item = decode_row(data, row_id=row_id, on_corrupt="raise", keyring=keyring)
        except (CorruptItemError, DecryptionError):
            break
        if not prune_prefix(item):
            break
        last = int(row_id)
    return last


def encode_output(output: list[Any], keyring: Keyring | None, *, ensure_ascii: bool) -> list[str]:
    """The compacted items, validated and encoded (and sealed) before any write."""
    data = encode_items(output, ensure_ascii=ensure_ascii)
    return keyring.encrypt_all(data) if keyring is not None else data


@dataclasses.dataclass(frozen=True, slots=True)
class Swap:
    """One ``replace_suffix`` call: what it expects to find and what it writes."""

    session_id: str
    expected: list[Row]
    """The suffix as the snapshot read it, oldest first (never empty)."""
    data: list[str]
    """The compacted items, encoded (and sealed)."""
    limit: int
    """The snapshot's limit: the prefix is scanned in batches of it, as the SDK does."""
    prune_prefix: PrunePrefix | None
    keyring: Keyring | None

    def is_current(self, newest_first: Sequence[Sequence[Any]]) -> bool:
        """Whether the newest rows now are exactly the expected suffix."""
        return [(int(r[0]), r[1]) for r in reversed(newest_first)] == self.expected

    @property
    def first(self) -> int:
        """The position (legacy tables: id) the suffix starts at."""
        return self.expected[0][0]


# -- SQLAlchemySession: through the backend's transaction ----------------------------------------


async def _prune_async(conn: AsyncConnection, cs: _Statements, swap: Swap) -> None:
    """Delete the leading run of the prefix that ``prune_prefix`` accepts (batch by batch)."""
    assert swap.prune_prefix is not None  # noqa: S101 - the caller checked
    after = -1
    while True:
        params = {"sid": swap.session_id, "after": after, "first": swap.first, "n": swap.limit}
        batch = (await conn.execute(cs.prefix, params)).all()
        upto = _expired_run(batch, swap.prune_prefix, swap.keyring)
        if upto is None:
            return
        await conn.execute(cs.delete_upto, {"sid": swap.session_id, "upto": upto})
        if upto != int(batch[-1][0]) or len(batch) < swap.limit:
            return
        after = upto


async def _swap_async(conn: AsyncConnection, backend: Backend, st: Statements, swap: Swap) -> None:
    """The swap's transaction body; raises :class:`_Stale` (rolled back) when the suffix moved.

    As every write does: an expired session first loses its items (so the compare
    below finds them gone: stale), then the session row is upserted, which is the
    write lock every writer of the session queues on, and renews its deadline.
    """
    cs, sid = statements(backend.names, backend.expiry), swap.session_id
    clock = backend.db.clock_params()
    if st.drop_expired is not None:
        await conn.execute(st.drop_expired, {"sid": sid, **clock})
    upsert = {"sid": sid, **clock, "expires": backend.deadline(), "n": len(swap.data)}
    top = await upsert_counting(conn, st, upsert)
    assert st.select_latest_locked is not None  # noqa: S101 - every database builds it
    current = (
        await conn.execute(st.select_latest_locked, {"sid": sid, "n": len(swap.expected)})
    ).all()
    if not swap.is_current(current):
        raise _Stale
    if swap.prune_prefix is not None:
        await _prune_async(conn, cs, swap)
    gone = await conn.execute(cs.delete_from, {"sid": sid, "first": swap.first})
    if gone.rowcount != len(swap.expected):  # a pop that did not wait for our lock
        raise _Stale
    if swap.data:
        await conn.execute(st.insert_message, numbered(sid, swap.data, top, clock))


async def _swap_retrying(backend: Backend, swap: Swap) -> bool:
    """Run the swap in one transaction, again if the database made it a deadlock victim."""
    st = await backend.statements()
    try:
        await backend.retried(lambda conn: _swap_async(conn, backend, st, swap))
    except _Stale:
        return False
    return True


async def snapshot(
    backend: Backend,
    session_id: str,
    limit: int,
    prune_prefix: PrunePrefix | None,
    *,
    ensure_ascii: bool,
) -> CompactionSnapshot | None:
    """Read the newest ``limit`` items; the returned swap runs in one backend transaction."""
    limit = check_limit(limit)
    st = await backend.statements()
    fetched = await backend.fetch(st.select_latest, {"sid": session_id, "n": limit + 1})
    decoded = decode_tail(fetched, limit, backend.keyring)
    if decoded is None:
        return None
    rows, items, complete = decoded
    keyring = backend.keyring

    async def replace_suffix(start: int, output: list[TResponseInputItem]) -> bool:
        expected = rows[start:]
        if not expected:
            return False
        data = encode_output(list(output), keyring, ensure_ascii=ensure_ascii)
        swap = Swap(session_id, expected, data, limit, prune_prefix, keyring)
        # Finished through a cancel (the outcome is then known), as the SDK's own swap is.
        return await run_to_completion(_swap_retrying(backend, swap))

    return CompactionSnapshot(items, complete, replace_suffix)


# -- the stdlib SQLiteSession: inside its write transaction --------------------------------------


@functools.cache
def compiled(names: TableNames, dialect: Any, head: bool = True) -> dict[str, CompiledSQL]:  # noqa: ANN401
    """The hook's statements compiled for ``sqlite3`` (``dialect``: the SQLite module's)."""
    cs = statements(names, head)
    return {field: compile_for(getattr(cs, field), dialect) for field in cs.__dataclass_fields__}


def _run(conn: sqlite3.Connection, c: CompiledSQL, params: dict[str, Any]) -> sqlite3.Cursor:
    return conn.execute(c.sql, c.positional(params))


def read_sync(
    conn: sqlite3.Connection, base: Mapping[str, CompiledSQL], session_id: str, limit: int
) -> list[Any]:
    """The snapshot's read on a ``sqlite3`` connection: ``limit + 1`` newest rows.

    ``base``: the session's own compiled statements (their ``select_latest`` hides an
    expired session).
    """
    return _run(conn, base["select_latest"], {"sid": session_id, "n": limit + 1}).fetchall()


def _prune_sync(conn: sqlite3.Connection, sql: dict[str, CompiledSQL], swap: Swap) -> None:
    """:func:`_prune_async` on a ``sqlite3`` connection."""
    assert swap.prune_prefix is not None  # noqa: S101 - the caller checked
    after = -1
    while True:
        params = {"sid": swap.session_id, "after": after, "first": swap.first, "n": swap.limit}
        batch = _run(conn, sql["prefix"], params).fetchall()
        upto = _expired_run(batch, swap.prune_prefix, swap.keyring)
        if upto is None:
            return
        _run(conn, sql["delete_upto"], {"sid": swap.session_id, "upto": upto})
        if upto != int(batch[-1][0]) or len(batch) < swap.limit:
            return
        after = upto


def swap_body_sync(
    conn: sqlite3.Connection,
    sql: dict[str, CompiledSQL],
    base: Mapping[str, CompiledSQL],
    swap: Swap,
    when: str,
    *,
    expires: object = None,
) -> bool:
    """The swap as one body of the SQLite module's write transaction (``when``: its clock).

    ``base`` are the session's own compiled statements (``drop_expired``,
    ``upsert_session`` renewing the deadline to ``expires``, ``select_latest``,
    ``insert_message``), run as the async swap runs them. Stale raises
    :data:`Stale`, so the savepoint or transaction rolls back; the caller turns it
    into ``False``.
    """
    sid = swap.session_id
    if "drop_expired" in base:
        _run(conn, base["drop_expired"], {"sid": sid, "now": when})
    upsert = {"sid": sid, "now": when, "expires": expires, "n": len(swap.data)}
    counter = _run(conn, base["upsert_session"], upsert).fetchall()  # (legacy tables: none)
    if not swap.is_current(
        _run(conn, base["select_latest"], {"sid": sid, "n": len(swap.expected)}).fetchall()
    ):
        raise _Stale
    if swap.prune_prefix is not None:
        _prune_sync(conn, sql, swap)
    if _run(conn, sql["delete_from"], {"sid": sid, "first": swap.first}).rowcount != len(
        swap.expected
    ):
        raise _Stale
    if swap.data:
        insert = base["insert_message"]
        top = int(counter[0][0]) if counter else len(swap.data)
        numbers = numbered(sid, swap.data, top, {"now": when})
        conn.executemany(insert.sql, [insert.positional(p) for p in numbers])
    return True


Stale = _Stale
"""For the stdlib session, which catches it around its write transaction."""


_READS_AND_WRITES = ("get_items", "add_items", "pop_item", "clear_session", "replace_items")


def declined(cls: type, base: type) -> bool:
    """Whether a subclass of ``base`` changes how items are read or written: then no snapshot.

    The SDK's sessions offer the hook to their exact class only; ours also to a
    subclass that leaves every read and write as it is (one that only observes,
    say), since the swap then bypasses nothing. A subclass that transforms items
    or keeps structures beside them (``AdvancedSQLAlchemySession``'s turns and
    branches) gets ``None``, and the SDK its whole-history path through it.
    """
    return any(
        getattr(cls, name, None) is not getattr(base, name, None) for name in _READS_AND_WRITES
    )
