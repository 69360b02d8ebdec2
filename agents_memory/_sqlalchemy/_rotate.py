"""Key rotation: re-encrypt every stored item not under the target key, in short batches.

Each batch is read by keyset (``(session_id, position)``, ascending, only rows not
already under the target key) and written back in its own transaction, as one
``executemany`` of ``UPDATE … WHERE session_id = :sid AND position = :pos AND
message_data = :old``: a row the application
popped, cleared or rewrote since it was read is left alone (counted as
``changed``), so rotating while the application writes loses nothing and never
overwrites a newer value. Every row is decrypted to its plaintext first and
sealed once under the target key: nothing is ever encrypted twice.

A run ends even while the application keeps appending under an old key: the scan
only moves forward, stops at the largest session id there is when it starts, and
inside a session stops at the position the session's counter (``last_position``)
had when the scan reached it. Rows written past those bounds are counted in
``remaining`` and taken by the next run.

Each batch first key-share-locks its rows' session rows (see :func:`_write_batch`),
so a clear, which checks envelope heads under that row's lock, never deletes a row
re-sealed under a key it lacks between its check and its delete.

Killed at any point, a rotation loses nothing (an uncommitted batch is rolled
back whole) and a new run resumes where it stopped: rows already under the
target key no longer match the scan's filter.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Update, and_, bindparam, func, or_, select, tuple_, update

from agents_memory._crypto import Keyring, is_envelope
from agents_memory._ids import check_sql_int
from agents_memory._sqlalchemy._backend import Backend


@dataclasses.dataclass(frozen=True, slots=True)
class KeyRotationReport:
    """What :meth:`SessionStore.rotate_keys` did (or, with ``dry_run``, would do)."""

    target: str
    """The key id every item is now (or would be) encrypted under."""
    dry_run: bool
    rotated: int = 0
    """Items re-encrypted (plaintext items included)."""
    changed: int = 0
    """Items changed or removed by someone else between read and write: left as they were."""
    batches: int = 0
    remaining: int = 0
    """Items not under the target key after the run (for ``dry_run``: before it)."""


def _needs_rotation(backend: Backend, target_head: str) -> Any:  # noqa: ANN401 - a clause
    data = backend.st.messages.c.message_data
    return func.substr(data, 1, len(target_head)) != target_head


async def count_pending(backend: Backend, keyring: Keyring, to: str) -> int:
    """How many stored items are not yet encrypted under key ``to``."""
    messages = backend.st.messages
    head = keyring.header(to) + ":"
    query = select(func.count()).select_from(messages).where(_needs_rotation(backend, head))
    rows = await backend.fetch(query)
    return int(rows[0][0])


def _reseal(keyring: Keyring, row_id: object, data: object) -> str | None:
    """The row sealed under ``keyring.current``; ``None`` for a value that is not text.

    A plaintext row is encrypted as it is, valid item or not (a corrupt row may
    still hold what a user said); an envelope is opened first (the typed error if
    the keyring lacks its key) and its plaintext sealed once.
    """
    if not isinstance(data, str):
        return None  # invalid UTF-8 written behind our back: not text, left as it is
    text = keyring.decrypt(data, row_id=row_id, cache=False) if is_envelope(data) else data
    return keyring.encrypt(text)


async def _write_batch(
    backend: Backend,
    write: Update,
    keyring: Keyring,
    rows: Sequence[Any],
) -> tuple[int, int]:
    """Re-seal ``rows`` in one short transaction; ``(rows written, rows tried)``.

    The updates go as one ``executemany`` (pipelined by the driver); how many
    applied is counted in the same transaction: the batch's rows now under the
    target key (a row someone changed meanwhile kept its value, so it is not).
    """
    updates = []
    sids = set()
    for sid, position, data in rows:
        sealed = _reseal(keyring, f"{sid!r}/{position}", data)
        if sealed is not None:
            updates.append({"rsid": sid, "rpos": position, "old": data, "new": sealed})
            sids.add(sid)
    if not updates:
        return 0, 0
    c = backend.st.messages.c
    head = keyring.header() + ":"
    applied = (
        select(func.count())
        .select_from(backend.st.messages)
        .where(
            tuple_(c.session_id, c.position).in_(bindparam("keys", expanding=True)),
            func.substr(c.message_data, 1, len(head)) == head,
        )
    )
    sessions = backend.st.sessions
    # Key-share-lock the batch's session rows first (in id order: rotations never wait in
    # a cycle), as every writer of items locks its session row: a checked clear holds
    # that row FOR UPDATE from before it reads the envelope heads until its delete, so a
    # row re-sealed under a key the clearing keyring lacks is never deleted unchecked.
    # Appends (Postgres: a no-key update of the row) do not wait for it; SQLite has one
    # writer (no row locks: the clause is not rendered).
    lock = (
        select(sessions.c.session_id)
        .where(sessions.c.session_id.in_(bindparam("sids", expanding=True)))
        .order_by(sessions.c.session_id)
        .with_for_update(read=True, key_share=True)
    )
    keys = [(u["rsid"], u["rpos"]) for u in updates]
    async with backend.transaction() as conn:
        await conn.execute(lock, {"sids": sorted(sids)})
        await conn.execute(write, updates)
        done = (await conn.execute(applied, {"keys": keys})).scalar_one()
    return int(done), len(updates)


async def rotate(
    backend: Backend,
    to: str,
    *,
    batch_size: int = 500,
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
) -> KeyRotationReport:
    """Re-encrypt every item not under ``to`` (see the module docstring)."""
    if backend.keyring is None:
        msg = "key rotation needs a keyring: open the store with encryption=Keyring(...)"
        raise ValueError(msg)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        msg = f"batch_size must be an int >= 1, got {batch_size!r}"
        raise ValueError(msg)
    check_sql_int("batch_size", batch_size)
    keyring = backend.keyring.with_current(to)
    if dry_run:
        left = await count_pending(backend, keyring, to)
        return KeyRotationReport(target=to, dry_run=True, remaining=left)
    messages, sessions = backend.st.messages, backend.st.sessions
    c = messages.c
    head = keyring.header(to) + ":"
    cursor_sid = bindparam("sid", type_=c.session_id.type)
    # Forward from (sid, after): the rest of session sid up to its bound, then the sessions
    # after it up to the last one there was at the start.
    scan = (
        select(c.session_id, c.position, c.message_data)
        .where(
            or_(
                and_(
                    c.session_id == cursor_sid,
                    c.position > bindparam("after"),
                    c.position <= bindparam("bound"),
                ),
                c.session_id > cursor_sid,
            ),
            c.session_id <= bindparam("last_sid", type_=c.session_id.type),
            _needs_rotation(backend, head),
        )
        .order_by(c.session_id, c.position)
        .limit(bindparam("n"))
    )
    counter = select(sessions.c.last_position).where(sessions.c.session_id == cursor_sid)
    write = (
        update(messages)
        .where(
            c.session_id == bindparam("rsid"),
            c.position == bindparam("rpos"),
            c.message_data == bindparam("old"),
        )
        .values(message_data=bindparam("new"))
    )
    rotated = changed = batches = 0
    newest = await backend.fetch(select(func.max(c.session_id)))
    if not newest or newest[0][0] is None:
        return KeyRotationReport(target=to, dry_run=False)
    params: dict[str, Any] = {"sid": "", "after": 0, "bound": 0, "last_sid": newest[0][0]}
    while True:
        rows = await backend.fetch(scan, {**params, "n": batch_size})
        if not rows:
            break
        done, tried = await _write_batch(backend, write, keyring, rows)
        rotated += done
        changed += tried - done
        batches += 1
        if progress is not None:
            progress(len(rows))
        if len(rows) < batch_size:
            break
        last: Any = rows[-1]
        sid, position = last[0], int(last[1])
        if sid != params["sid"]:
            # First time in this session: what it holds now is what this run takes, so an
            # application appending under an old key cannot keep the scan here for ever.
            top = await backend.fetch(counter, {"sid": sid})
            params["bound"] = int(top[0][0]) if top and top[0][0] is not None else position
        params.update(sid=sid, after=position)
    left = await count_pending(backend, keyring, to)
    return KeyRotationReport(
        target=to, dry_run=False, rotated=rotated, changed=changed, batches=batches, remaining=left
    )
