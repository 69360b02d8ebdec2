"""Encryption at rest on every database: round trip, mixed rows, failures that change nothing."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from encrypted_stores import store_on
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory import (
    DecryptionError,
    Keyring,
    MissingKeyError,
    SessionStore,
    SQLAlchemySession,
    TableNames,
    get_models,
)

KEY_A = Keyring.generate_key()
KEY_B = Keyring.generate_key()
OTHER = Keyring.generate_key()


@pytest.fixture
async def enc(engine: AsyncEngine, names: TableNames) -> AsyncIterator[SessionStore]:
    s = store_on(engine, names, Keyring({"a": KEY_A}, current="a"))
    yield s
    await s.close()


async def raw_rows(engine: AsyncEngine, names: TableNames) -> list[tuple[int, str, str]]:
    m = get_models(names).Message.__table__
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(m.c.position, m.c.session_id, m.c.message_data).order_by(
                m.c.session_id, m.c.position
            )
        )
        return [(int(r[0]), str(r[1]), str(r[2])) for r in rows]


ITEMS: list[Any] = [
    {"role": "user", "content": "my card is 4111 1111 1111 1111, naïve 🙂"},
    {"role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
]


async def test_round_trip_and_nothing_readable_at_rest(
    enc: SessionStore, engine: AsyncEngine, names: TableNames
) -> None:
    s = enc.session("u1")
    await s.add_items(ITEMS)
    assert await s.get_items() == ITEMS
    assert await s.get_items(limit=2) == ITEMS[1:]
    assert [i async for i in s.iter_items(batch_size=2)] == ITEMS
    rows = await raw_rows(engine, names)
    assert len(rows) == len(ITEMS)
    for _, _, data in rows:
        assert data.startswith(enc.encryption.header("a") + ":")  # type: ignore[union-attr]
        assert "4111" not in data
        assert "assistant" not in data
    assert await s.pop_item() == ITEMS[-1]
    assert await s.get_items() == ITEMS[:2]
    await s.clear_session()
    assert await s.get_items() == []
    assert await raw_rows(engine, names) == []


async def test_mixed_plaintext_and_encrypted_rows_read_in_order(
    engine: AsyncEngine, names: TableNames
) -> None:
    plain = store_on(engine, names, None)
    await plain.session("u").add_items([{"n": 1}, {"n": 2}])
    enc = store_on(engine, names, Keyring({"a": KEY_A}, current="a"))
    await enc.session("u").add_items([{"n": 3}])
    enc_b = store_on(engine, names, Keyring({"a": KEY_A, "b": KEY_B}, current="b"))
    await enc_b.session("u").add_items([{"n": 4}])
    assert await enc_b.session("u").get_items() == [{"n": i} for i in (1, 2, 3, 4)]
    assert await enc_b.session("u").get_items(limit=3) == [{"n": i} for i in (2, 3, 4)]
    # pop crosses from encrypted rows into plaintext ones
    assert [await enc_b.session("u").pop_item() for _ in range(5)] == [
        {"n": 4},
        {"n": 3},
        {"n": 2},
        {"n": 1},
        None,
    ]


async def _assert_refused(
    engine: AsyncEngine,
    names: TableNames,
    keyring: Keyring | None,
    error: type[Exception],
    key_id: str,
) -> None:
    """Every operation that reads or deletes raises ``error``; not one row changes."""
    before = await raw_rows(engine, names)
    store = store_on(engine, names, keyring)
    s = store.session("u")
    for call in (
        s.get_items,
        lambda: s.get_items(limit=1),
        s.pop_item,
        s.clear_session,
        lambda: store.delete_session("u"),
        lambda: s.replace_items([{"n": 9}]),
        lambda: store.prune(keep_last=0),
        lambda: store.prune(older_than=dt.timedelta(milliseconds=1)),
    ):
        with pytest.raises(error) as info:
            await call()
        assert info.value.key_id == key_id  # type: ignore[attr-defined]
        assert key_id in str(info.value)
    assert await raw_rows(engine, names) == before


async def test_replace_items_seals_the_new_history(
    enc: SessionStore, engine: AsyncEngine, names: TableNames
) -> None:
    """replace_items on an encrypted store writes ciphertext, as add_items does."""
    s = enc.session("u")
    await s.add_items(ITEMS)
    await s.replace_items(ITEMS[:1])
    assert await s.get_items() == ITEMS[:1]
    rows = await raw_rows(engine, names)
    assert len(rows) == 1
    assert rows[0][2].startswith(enc.encryption.header("a") + ":")  # type: ignore[union-attr]
    assert "4111" not in rows[0][2]


async def test_prune_deletes_what_the_keyring_opens(
    enc: SessionStore, engine: AsyncEngine, names: TableNames
) -> None:
    """With the right key a prune trims and deletes encrypted sessions as any others."""
    await enc.session("u").add_items(ITEMS)
    report = await enc.prune(keep_last=1)
    assert report.items_deleted == 2
    assert await enc.session("u").get_items() == ITEMS[-1:]
    await asyncio.sleep(0.01)
    report = await enc.prune(older_than=dt.timedelta(milliseconds=1))
    assert report.sessions_deleted == 1
    assert await raw_rows(engine, names) == []


async def test_wrong_missing_or_no_key_changes_no_row(
    enc: SessionStore, engine: AsyncEngine, names: TableNames
) -> None:
    await enc.session("u").add_items([{"n": 1}, {"n": 2}])
    # the same key id holding another key
    await _assert_refused(engine, names, Keyring({"a": OTHER}, current="a"), DecryptionError, "a")
    # a keyring without that id
    await _assert_refused(engine, names, Keyring({"b": KEY_B}, current="b"), MissingKeyError, "a")
    # a store opened without encryption: refuses instead of returning ciphertext
    await _assert_refused(engine, names, None, MissingKeyError, "a")
    assert await enc.session("u").get_items() == [{"n": 1}, {"n": 2}]


async def test_unreadable_row_below_plain_ones_blocks_clear_not_pop(
    engine: AsyncEngine, names: TableNames
) -> None:
    """A plain store pops plaintext rows above an encrypted one; its clear refuses whole."""
    enc = store_on(engine, names, Keyring({"a": KEY_A}, current="a"))
    await enc.session("u").add_items([{"secret": 1}])
    plain = store_on(engine, names, None)
    await plain.session("u").add_items([{"n": 2}])
    assert await plain.session("u").pop_item() == {"n": 2}
    with pytest.raises(MissingKeyError):
        await plain.session("u").pop_item()
    with pytest.raises(MissingKeyError):
        await plain.session("u").clear_session()
    assert await enc.session("u").get_items() == [{"secret": 1}]


async def test_altered_ciphertext_is_a_typed_error_and_stays(
    enc: SessionStore, engine: AsyncEngine, names: TableNames
) -> None:
    await enc.session("u").add_items([{"n": 1}])
    ((row_id, _, data),) = await raw_rows(engine, names)
    head, _, body = data.rpartition(":")
    blob = bytearray(base64.b64decode(body))
    blob[-1] ^= 1
    tampered = f"{head}:{base64.b64encode(bytes(blob)).decode()}"
    m = get_models(names).Message.__table__
    async with engine.begin() as conn:
        await conn.execute(
            m.update()
            .where(m.c.session_id == "u", m.c.position == row_id)
            .values(message_data=tampered)
        )
    with pytest.raises(DecryptionError, match="failed authentication"):
        await enc.session("u").get_items()
    with pytest.raises(DecryptionError):
        await enc.session("u").pop_item()
    assert [r[2] for r in await raw_rows(engine, names)] == [tampered]


async def test_rows_carried_to_another_session_id_still_open(
    enc: SessionStore, engine: AsyncEngine, names: TableNames
) -> None:
    """The session id is not bound into the ciphertext, so fork/copy need no key."""
    await enc.session("from").add_items([{"n": 1}])
    m = get_models(names).Message.__table__
    await enc.session("to").add_items([{"n": 2}])
    async with engine.begin() as conn:
        # (to position 0: before the target's first item, as its id was smaller before 0006)
        await conn.execute(
            m.update().where(m.c.session_id == "from").values(session_id="to", position=0)
        )
    assert await enc.session("to").get_items() == [{"n": 1}, {"n": 2}]


async def test_session_class_takes_encryption_too(engine: AsyncEngine, names: TableNames) -> None:
    keyring = Keyring({"a": KEY_A}, current="a")
    s = SQLAlchemySession(
        "u",
        engine=engine,
        create_tables=True,
        sessions_table=names.sessions,
        messages_table=names.messages,
        encryption=keyring,
    )
    await s.add_items([{"n": 1}])
    assert await s.get_items() == [{"n": 1}]
    assert (await raw_rows(engine, names))[0][2].startswith("am1:a:")
    await s.close()


async def test_no_key_material_in_errors_reprs_or_logs(
    engine: AsyncEngine,
    names: TableNames,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    raw = base64.urlsafe_b64decode(KEY_A)
    forms = {
        KEY_A,
        KEY_A.rstrip("="),
        base64.b64encode(raw).decode(),
        raw.hex(),
        raw.hex().upper(),
        repr(raw),
    }
    caplog.set_level(logging.DEBUG)
    seen: list[str] = []
    good = Keyring({"a": KEY_A}, current="a")
    wrong = Keyring({"a": base64.urlsafe_b64encode(b"x" * 32).decode()}, current="a")
    store = store_on(engine, names, good)
    seen += [repr(good), str(good), repr(store), repr(store.session("u"))]
    await store.session("u").add_items([{"n": 1}])
    for bad in (wrong, Keyring({"b": KEY_A}, current="b"), None):
        s = store_on(engine, names, bad).session("u")
        for call in (s.get_items, s.pop_item, s.clear_session):
            with pytest.raises(DecryptionError) as info:
                await call()
            seen += [str(info.value), repr(info.value)]
    for broken in ({"a": KEY_A[:-3]}, {"a": KEY_A + "xx"}, {"bad id": KEY_A}):
        with pytest.raises(ValueError) as info:  # noqa: PT011 - the message is checked below
            Keyring(broken, current="a")
        seen += [str(info.value)]
    with pytest.raises(ValueError) as info:  # noqa: PT011
        Keyring({"a": KEY_A}, current="zz")
    seen.append(str(info.value))
    captured = capsys.readouterr()
    text = "\n".join([*seen, caplog.text, captured.out, captured.err])
    assert "key id" in text or "'a'" in text  # the failures did speak
    for form in forms:
        assert form not in text


async def test_delete_session_force_deletes_what_no_key_opens(
    enc: SessionStore, engine: AsyncEngine, names: TableNames
) -> None:
    """A key lost for good: the refused delete goes through with force=True, and only then."""
    await enc.session("u").add_items([{"n": 1}])
    await enc.session("other").add_items([{"n": 2}])
    lost = store_on(engine, names, Keyring({"b": KEY_B}, current="b"))
    with pytest.raises(MissingKeyError):
        await lost.delete_session("u")
    assert len(await raw_rows(engine, names)) == 2
    assert await lost.delete_session("u", force=True) is True
    assert [r[1] for r in await raw_rows(engine, names)] == ["other"]
    assert await store_on(engine, names, None).delete_session("other", force=True) is True
    assert await raw_rows(engine, names) == []
