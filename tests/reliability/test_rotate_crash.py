"""Crash: a key rotation is SIGKILLed at random moments, many times, then resumed.

After every kill each item is readable with the keyring, none is lost or
duplicated, and none is sealed twice; a final rotation run in the test finishes
the job with nothing left over.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import random
import signal
import time
from typing import Any

import _rotate_child
import pytest
from _support import Ledger, scaled
from sqlalchemy import select

from agents_memory import Keyring, SessionStore, get_models
from agents_memory._codec import decode_json

pytestmark = pytest.mark.reliability

PRELOAD = ["agents_memory", "sqlalchemy.ext.asyncio", "aiosqlite", "asyncpg", "_rotate_child"]
KEYS = {"a": Keyring.generate_key(), "b": Keyring.generate_key()}
KEYRING = Keyring(KEYS, current="a")
SESSIONS = 6
ITEMS = 60


def _context() -> Any:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


async def _kill_one(ctx: Any, url: str, tables: tuple[str, str]) -> int:
    """Start a rotating child, SIGKILL it after a random time; the passes it finished."""
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_rotate_child.main, args=(url, tables, KEYS, writer), daemon=True)
    proc.start()
    writer.close()
    try:
        first = await asyncio.to_thread(reader.recv_bytes)
        assert first == b"ready", first
        await asyncio.sleep(random.uniform(0.01, 0.3))
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        await asyncio.to_thread(proc.join, 30)
    passes = 0
    while True:
        try:
            reader.recv_bytes()
        except EOFError:
            break
        passes += 1
    reader.close()
    return passes


async def _check(store: SessionStore, expected: dict[str, list[dict[str, Any]]]) -> None:
    """Every item readable and in place; every row sealed exactly once."""
    for sid, items in expected.items():
        assert await store.session(sid).get_items() == items
    m = get_models(store.table_names).Message.__table__
    async with store.engine.connect() as conn:
        rows = [str(r[0]) for r in await conn.execute(select(m.c.message_data))]
    assert len(rows) == SESSIONS * ITEMS
    for data in rows:
        inner = KEYRING.decrypt(data) if data.startswith("am") else data
        assert isinstance(decode_json(inner), dict)  # plaintext JSON, not another envelope


async def test_sigkill_during_rotation_loses_nothing_and_resumes(
    file_backend: Any, store: SessionStore, ledger: Ledger
) -> None:
    kills = scaled(10, minimum=3)
    names = store.table_names
    enc = SessionStore(
        store.engine,
        sessions_table=names.sessions,
        messages_table=names.messages,
        encryption=KEYRING,
    )
    expected: dict[str, list[dict[str, Any]]] = {}
    for s in range(SESSIONS):
        items = [{"s": s, "n": n, "p": "x" * 300} for n in range(ITEMS)]
        # half plaintext (as a store that turned encryption on later has), half under "a"
        await store.session(f"s{s}").add_items(items[: ITEMS // 2])
        await enc.session(f"s{s}").add_items(items[ITEMS // 2 :])
        expected[f"s{s}"] = items
    ctx = _context()
    started = time.monotonic()
    passes = mid_rotation = 0
    for _ in range(kills):
        passes += await _kill_one(ctx, file_backend.url, (names.sessions, names.messages))
        left_a = (await enc.rotate_keys("a", dry_run=True)).remaining
        left_b = (await enc.rotate_keys("b", dry_run=True)).remaining
        mid_rotation += left_a > 0 and left_b > 0  # killed part-way through a pass
        await _check(enc, expected)
    final = await enc.rotate_keys("b", batch_size=25)
    assert final.remaining == 0
    await _check(enc, expected)
    ledger.add(
        "Crash",
        "SIGKILL a key rotation (batches of 7) at a random moment, then check and resume",
        times=kills,
        lost=0,
        unit="kills",
        note=(
            f"{mid_rotation} kills landed mid-pass; {passes} passes completed before kills; "
            f"{time.monotonic() - started:.0f}s"
        ),
    )
    assert mid_rotation > 0  # the crash hit a rotation in progress at least once
