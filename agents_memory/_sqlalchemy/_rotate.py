"""Key rotation: re-encrypt every stored item not under the target key, in short batches.

Each batch is read by keyset (message id, ascending, only rows not already under
the target key) and written back in its own transaction, as one ``executemany``
of ``UPDATE … WHERE id = :id AND message_data = :old``: a row the application
popped, cleared or rewrote since it was read is left alone (counted as
``changed``), so rotating while the application writes loses nothing and never
overwrites a newer value. Every row is decrypted to its plaintext first and
sealed once under the target key: nothing is ever encrypted twice.

A run re-encrypts the rows that exist when it starts (ids up to the newest then),
so it ends even while the application keeps appending under an old key; such
later rows are counted in ``remaining`` and taken by the next run.

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

from sqlalchemy import Update, bindparam, func, select, update

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
    for row_id, data, sid in rows:
        sealed = _reseal(keyring, row_id, data)
        if sealed is not None:
            updates.append({"rid": row_id, "old": data, "new": sealed})
            sids.add(sid)
    if not updates:
        return 0, 0
    c = backend.st.messages.c
    head = keyring.header() + ":"
    applied = (
        select(func.count())
        .select_from(backend.st.messages)
        .where(
            c.id.in_(bindparam("ids", expanding=True)),
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
    ids = [u["rid"] for u in updates]
    async with backend.transaction() as conn:
        await conn.execute(lock, {"sids": sorted(sids)})
        await conn.execute(write, updates)
        done = (await conn.execute(applied, {"ids": ids})).scalar_one()
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
    messages = backend.st.messages
    c = messages.c
    head = keyring.header(to) + ":"
    scan = (
        select(c.id, c.message_data, c.session_id)
        .where(c.id > bindparam("after"), c.id <= bindparam("upto"), _needs_rotation(backend, head))
        .order_by(c.id)
        .limit(bindparam("n"))
    )
    write = (
        update(messages)
        .where(c.id == bindparam("rid"), c.message_data == bindparam("old"))
        .values(message_data=bindparam("new"))
    )
    rotated = changed = batches = 0
    after = -1
    # The rows there are when the run starts: an application appending under an old key
    # meanwhile would otherwise keep the scan chasing new ids for ever. What it writes
    # after this is counted in ``remaining``; the next run takes it.
    newest = await backend.fetch(select(func.max(c.id)))
    upto = newest[0][0] if newest and newest[0][0] is not None else -1
    while True:
        rows = await backend.fetch(scan, {"after": after, "upto": upto, "n": batch_size})
        if not rows:
            break
        done, tried = await _write_batch(backend, write, keyring, rows)
        rotated += done
        changed += tried - done
        batches += 1
        if progress is not None:
            progress(len(rows))
        after = int(rows[-1][0])
        if len(rows) < batch_size:
            break
    left = await count_pending(backend, keyring, to)
    return KeyRotationReport(
        target=to, dry_run=False, rotated=rotated, changed=changed, batches=batches, remaining=left
    )
