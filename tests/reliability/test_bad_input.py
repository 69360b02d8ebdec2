"""Bad input: every hostile item, batch, session id and table name round-trips or is refused.

A refusal must be a typed error (``TypeError``/``ValueError``) raised before a
single statement reaches the database; a statement counter on the engine proves it.
"""

from __future__ import annotations

import datetime as dt
import decimal
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from _support import Ledger, count_rows
from sqlalchemy import event, text

from agents_memory import SessionStore, SQLAlchemySession
from agents_memory._codec import MAX_NESTING

pytestmark = pytest.mark.reliability


def nested(depth: int) -> dict[str, Any]:
    value: Any = "leaf"
    for _ in range(depth - 1):
        value = [value]
    return {"v": value}


def circular() -> dict[str, Any]:
    item: dict[str, Any] = {"a": 1}
    item["self"] = item
    return item


ROUND_TRIP: dict[str, list[dict[str, Any]]] = {
    "NUL in value and key": [{"c": "a\x00b", "k\x00": "\x00"}],
    "lone surrogates": [{"hi": "\ud800", "lo": "x\udfffy", "pair split": "\ud83d", "\udc00": 1}],
    "line/paragraph separators, BOM, RTL": [{"t": "\u2028\u2029\ufeff\u202e"}],
    "emoji, CJK, combining marks": [{"t": "😀👩‍👩‍👧 中文 é"}],
    "quotes, SQL, backslashes": [{"t": "'; DROP TABLE x; --\" \\ \\u0000 %s ?"}],
    "empty item and empty strings": [{}, {"": ""}],
    "64-bit edges and big ints": [{"a": 2**63, "b": -(2**63) - 1, "c": 10**300}],
    "float edges": [{"max": 1.7976931348623157e308, "tiny": 5e-324, "neg0": -0.0}],
    "unicode keys": [{"ключ": 1, "キー": 2, "😀": 3}],
    f"nesting at the limit ({MAX_NESTING})": [nested(MAX_NESTING)],
}

REFUSED: dict[str, list[Any]] = {
    "object()": [{"ok": 1}, {"x": object()}],
    "set": [{"x": {1, 2}}],
    "bytes": [{"x": b"raw"}],
    "Decimal": [{"x": decimal.Decimal("1.5")}],
    "datetime": [{"x": dt.datetime(2024, 1, 1, tzinfo=dt.UTC)}],
    "complex": [{"x": 1j}],
    "None item": [{"ok": 1}, None],
    "list item": [[1, 2]],
    "str item": ["not a dict"],
    "int item": [42],
    "NaN": [{"x": math.nan}],
    "Infinity": [{"x": math.inf}],
    "-Infinity nested": [{"x": [{"y": -math.inf}]}],
    "int key": [{1: "x"}],
    "None key": [{None: "x"}],
    "tuple key": [{(1, 2): "x"}],
    "self-referencing item": [circular()],
    f"nesting past the limit ({MAX_NESTING + 1})": [nested(MAX_NESTING + 1)],
    "nesting 100,000 deep": [nested(100_000)],
    "int with 5,000 digits": [{"x": 10**5000}],
}

BAD_BATCHES: dict[str, Any] = {
    "a dict instead of a list": {"role": "user"},
    "a string": "abc",
    "bytes": b"abc",
    "a generator": (x for x in [{"a": 1}]),
    "None": None,
}


@contextmanager
def statements(store: SessionStore) -> Iterator[list[str]]:
    """Every statement the store's engine runs inside the block."""
    seen: list[str] = []

    def record(*args: Any) -> None:
        seen.append(str(args[2]))

    target = store.engine.sync_engine
    event.listen(target, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(target, "before_cursor_execute", record)


async def test_hostile_items_round_trip_or_are_refused(store: SessionStore, ledger: Ledger) -> None:
    """Awkward items come back exactly; unstorable ones are a typed error with nothing written."""
    s = store.session("items")
    await s.add_items([{"seed": 0}])
    wrong = 0
    for name, batch in ROUND_TRIP.items():
        await s.add_items(batch)
        got = (await s.get_items(limit=len(batch))) if batch else []
        wrong += got != batch or [repr(x) for x in got] != [repr(x) for x in batch]
        assert got == batch, name
    expected = await s.get_items()
    refused_wrong = 0
    for name, batch in {**REFUSED, **BAD_BATCHES}.items():
        with statements(store) as seen:
            try:
                await s.add_items(batch)
            except (TypeError, ValueError):
                pass
            else:
                refused_wrong += 1
        refused_wrong += bool(seen)
        assert not seen, f"{name}: statements ran: {seen}"
    assert await s.get_items() == expected
    ledger.add(
        "Bad input",
        f"awkward items that must round-trip exactly ({len(ROUND_TRIP)} kinds)",
        times=len(ROUND_TRIP),
        lost=wrong,
        unit="cases",
    )
    ledger.add(
        "Bad input",
        f"unstorable items and batches that must be refused ({len(REFUSED) + len(BAD_BATCHES)} "
        "kinds: NaN/Infinity, non-dicts, non-serialisable, bad keys, cycles, depth, huge ints)",
        times=len(REFUSED) + len(BAD_BATCHES),
        lost=refused_wrong,
        unit="cases",
        note="'lost' counts an untyped error, no error, or any statement run",
    )
    assert (wrong, refused_wrong) == (0, 0)


async def _max_packet(store: SessionStore) -> int:
    async with store.engine.connect() as conn:
        return int((await conn.execute(text("SELECT @@max_allowed_packet"))).scalar_one())


async def test_huge_item_and_huge_batch(store: SessionStore, ledger: Ledger) -> None:
    """A 20 MB item and a 100,000-item batch round-trip; a bad last item writes nothing."""
    s = store.session("huge")
    big = {"role": "user", "content": "é" * (10 * 1024 * 1024)}  # 20 MB of UTF-8
    if store.engine.dialect.name in ("mysql", "mariadb") and await _max_packet(store) < 21 << 20:
        # The server refuses statements over max_allowed_packet: a typed error, nothing written.
        with pytest.raises(ValueError, match="max_allowed_packet"):
            await s.add_items([big])
        assert await s.get_items() == []
        big = {"role": "user", "content": "é" * (1024 * 1024)}  # what this server accepts
    await s.add_items([big])
    got_big = await s.get_items()
    assert got_big == [big]
    batch = [{"i": i, "t": "m"} for i in range(100_000)]
    await s.add_items(batch)
    got = await s.get_items()
    assert got[0] == big
    assert got[1:] == batch
    assert await s.get_items(limit=3) == batch[-3:]
    rows = await count_rows(store.engine, store.table_names)
    with statements(store) as seen, pytest.raises(ValueError, match="99999"):
        await s.add_items([*batch[:-1], {"x": math.nan}])
    assert not seen
    assert await count_rows(store.engine, store.table_names) == rows
    ledger.add(
        "Bad input",
        "a 20 MB item; a 100,000-item batch; the same batch with a NaN in its last item",
        times=3,
        lost=0,
        unit="cases",
        note="the bad batch: ValueError naming item 99999, 0 statements run",
    )


HOSTILE_IDS_OK = [
    "'; DROP TABLE agent_sessions; --",
    "a\"b'c`d",
    "ユーザー 😀",
    "  spaces  ",
    "%_\\*?",
    "tab\tnew\nline",
    "x" * 255,
]
HOSTILE_IDS_BAD: list[tuple[Any, type[Exception]]] = [
    ("x" * 10_240, ValueError),
    ("x" * 256, ValueError),
    ("", ValueError),
    ("nul\x00id", ValueError),
    ("lone \ud800", ValueError),
    (None, TypeError),
    (42, TypeError),
    (b"bytes", TypeError),
]


async def test_hostile_session_ids(store: SessionStore, ledger: Ledger) -> None:
    """Ids with quotes, SQL and unicode are plain data; unstorable ids are refused up front."""
    wrong = 0
    for i, sid in enumerate(HOSTILE_IDS_OK):
        await store.session(sid).add_items([{"i": i}])
    for i, sid in enumerate(HOSTILE_IDS_OK):
        wrong += await store.session(sid).get_items() != [{"i": i}]
        wrong += (await store.get_session(sid)) is None
    rows = await count_rows(store.engine, store.table_names)
    for sid, error in HOSTILE_IDS_BAD:
        with statements(store) as seen:
            try:
                await store.session(sid).add_items([{"x": 1}])
            except error:
                pass
            else:
                wrong += 1
            try:
                await store.delete_session(sid)
            except error:
                pass
            else:
                wrong += 1
        wrong += bool(seen)
    assert await count_rows(store.engine, store.table_names) == rows
    ledger.add(
        "Bad input",
        f"hostile session ids: {len(HOSTILE_IDS_OK)} that must round-trip (quotes, SQL, "
        f"unicode, 255 chars), {len(HOSTILE_IDS_BAD)} that must be refused (10 KB, NUL, "
        "surrogate, empty, non-str)",
        times=len(HOSTILE_IDS_OK) + len(HOSTILE_IDS_BAD),
        lost=wrong,
        unit="cases",
    )
    assert wrong == 0


HOSTILE_TABLES: list[Any] = [
    'agent"; DROP TABLE x; --',
    "a'b",
    "a`b",
    "a b",
    "public.agent_sessions",
    "ünïcode",
    "テーブル",
    "1starts_with_digit",
    "",
    "x" * 64,
    "x" * 10_240,
    "semi;colon",
    "dash-name",
    "null\x00byte",
    None,
    42,
]


async def test_hostile_table_names(store: SessionStore, ledger: Ledger) -> None:
    """Table names that are not plain identifiers are refused before any statement runs."""
    wrong = 0
    with statements(store) as seen:
        for name in HOSTILE_TABLES:
            for kwargs in ({"sessions_table": name}, {"messages_table": name}):
                for make in (
                    lambda kw: SessionStore(store.engine, create_tables=True, **kw),
                    lambda kw: SQLAlchemySession("s", engine=store.engine, **kw),
                ):
                    try:
                        make(kwargs)
                    except (TypeError, ValueError):
                        pass
                    else:
                        wrong += 1
    wrong += bool(seen)
    ledger.add(
        "Bad input",
        f"hostile table names ({len(HOSTILE_TABLES)}: quotes, SQL, unicode, 10 KB, dots, NUL, "
        "non-str) for either table, via SessionStore and SQLAlchemySession",
        times=len(HOSTILE_TABLES) * 4,
        lost=wrong,
        unit="cases",
    )
    assert wrong == 0
