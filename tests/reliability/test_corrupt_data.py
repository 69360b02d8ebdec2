"""Corrupt data: rows written behind our back are skipped with a warning, or raise when asked.

Corrupt rows of many kinds are interleaved at random with valid items. Reads,
limits, streaming and pops must return exactly the valid items (limit still
counting valid ones), log one warning per corrupt row read, and never crash;
``on_corrupt="raise"`` turns the same rows into ``CorruptItemError``.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import pytest
import raw_rows
from _support import Ledger, insert_raw, scaled
from sqlalchemy import text

from agents_memory import CorruptItemError, SessionStore

pytestmark = pytest.mark.reliability

CORRUPT_TEXT = [
    "{not json",
    "",
    "null",
    '"a string"',
    "[1, 2]",
    "123",
    "true",
    '{"truncated": ',
    "[" * 100_000 + "]" * 100_000,
    '{"a": NaN}',
    "{'single': 'quotes'}",
]


async def write_corrupt(store: SessionStore, sid: str, kind: Any, dialect: str) -> None:
    """One corrupt row; SQLite also gets non-text values and invalid UTF-8 in a TEXT column."""
    if kind == "invalid utf-8" and dialect == "sqlite":
        names = store.table_names
        async with store.engine.begin() as conn:
            position = await raw_rows.next_position(conn, names, sid)
            await conn.execute(
                text(
                    f"INSERT INTO {names.messages} (session_id, position, message_data) "
                    "VALUES (:s, :p, CAST(:d AS TEXT))"
                ),
                {"s": sid, "p": position, "d": b'{"a":"\xff\xfe"}'},
            )
        return
    await insert_raw(store.engine, store.table_names, sid, kind)


def corrupt_kinds(dialect: str) -> list[Any]:
    if dialect == "sqlite":  # dynamic typing: any value fits in a TEXT column
        return [*CORRUPT_TEXT, "invalid utf-8", 42, 1.5, b"\xff\x00binary"]
    return CORRUPT_TEXT


async def test_corrupt_rows_never_break_reads_limits_or_pops(
    store: SessionStore, ledger: Ledger, caplog: pytest.LogCaptureFixture
) -> None:
    """Random layouts of valid and corrupt rows: every read returns exactly the valid items."""
    dialect = store.engine.dialect.name
    kinds = corrupt_kinds(dialect)
    trials = scaled(8, minimum=3)
    await store.session("warmup").get_items()  # creates the tables before any raw write
    mismatches = corrupt_written = reads = 0
    for trial in range(trials):
        sid = f"c{trial}"
        s = store.session(sid)
        valid: list[dict[str, Any]] = [{"trial": trial, "step": "first"}]
        await s.add_items(valid)  # the session row, which raw rows reference
        corrupt_here = 0
        for step in range(30):
            if random.random() < 0.3:
                await write_corrupt(store, sid, random.choice(kinds), dialect)
                corrupt_here += 1
            else:
                item = {"trial": trial, "step": step}
                await s.add_items([item])
                valid.append(item)
        if trial == 0:  # every kind at least once
            for kind in kinds:
                await write_corrupt(store, sid, kind, dialect)
                corrupt_here += 1
            await s.add_items([{"trial": 0, "step": "last"}])
            valid.append({"trial": 0, "step": "last"})
        corrupt_written += corrupt_here
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="agents_memory"):
            checks = [(await s.get_items(), valid)]
            warned = sum("skipping stored item" in r.getMessage() for r in caplog.records)
            mismatches += warned != corrupt_here
            checks += [
                (await s.get_items(limit=limit), valid[-limit:])
                for limit in (1, 2, 5, 13, len(valid), len(valid) + 7)
            ]
            checks.append(([i async for i in s.iter_items(batch_size=4)], valid))
            popped = []
            while (item := await s.pop_item()) is not None:
                popped.append(item)
            checks.append((popped, valid[::-1]))
            checks.append((await s.get_items(), []))
        reads += len(checks)
        mismatches += sum(got != expected for got, expected in checks)
        assert all(got == expected for got, expected in checks), trial
        assert warned == corrupt_here, (warned, corrupt_here)
    ledger.add(
        "Corrupt data",
        f"{len(kinds)} kinds of corrupt rows interleaved with valid items: get, get(limit) x6, "
        "iter_items, pop until empty",
        times=reads,
        lost=mismatches,
        unit="reads",
        note=f"{corrupt_written} corrupt rows over {trials} layouts, each skipped with a warning",
    )
    assert mismatches == 0


async def test_on_corrupt_raise(store: SessionStore, ledger: Ledger) -> None:
    """With on_corrupt="raise", reads and pops raise CorruptItemError and the row stays put."""
    dialect = store.engine.dialect.name
    names = store.table_names
    strict = SessionStore(
        store.engine,
        sessions_table=names.sessions,
        messages_table=names.messages,
        on_corrupt="raise",
    )
    wrong = 0
    kinds = corrupt_kinds(dialect)
    for i, kind in enumerate(kinds):
        sid = f"strict{i}"
        await store.session(sid).add_items([{"ok": 1}])
        await write_corrupt(store, sid, kind, dialect)
        s = strict.session(sid)
        for call in (s.get_items, lambda s=s: s.get_items(limit=1), s.pop_item):
            try:
                await call()
            except CorruptItemError:
                pass
            else:
                wrong += 1
        # the lenient store still sees the valid item; the corrupt row was not popped away
        wrong += await store.session(sid).get_items() != [{"ok": 1}]
        wrong += await store.session(sid).pop_item() != {"ok": 1}
    ledger.add(
        "Corrupt data",
        f'on_corrupt="raise": get, get(limit), pop over each of {len(kinds)} corrupt kinds',
        times=len(kinds) * 3,
        lost=wrong,
        unit="calls",
        note="'lost' counts a call that did not raise CorruptItemError or a row popped anyway",
    )
    assert wrong == 0
