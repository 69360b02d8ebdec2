"""Key rotation on every database: converts plaintext and old keys, resumes, and races writers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from encrypted_stores import store_on, stored
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory import Keyring, MissingKeyError, SessionStore, TableNames, get_models
from agents_memory._codec import decode_json

KEY_A = Keyring.generate_key()
KEY_B = Keyring.generate_key()
BOTH = Keyring({"a": KEY_A, "b": KEY_B}, current="a")


def assert_all_under(rows: list[str], keyring: Keyring, key_id: str) -> None:
    """Every row under ``key_id``, sealed exactly once (its plaintext is a JSON object)."""
    head = keyring.header(key_id) + ":"
    for data in rows:
        assert data.startswith(head)
        inner = keyring.decrypt(data)
        assert inner.startswith("{")
        assert isinstance(decode_json(inner), dict)


@pytest.fixture
async def mixed(engine: AsyncEngine, names: TableNames) -> AsyncIterator[SessionStore]:
    """Plaintext rows, then rows under key a, across several sessions."""
    plain = store_on(engine, names, None)
    for s in range(3):
        await plain.session(f"s{s}").add_items([{"s": s, "n": n} for n in range(7)])
    store = store_on(engine, names, BOTH)
    for s in range(3):
        await store.session(f"s{s}").add_items([{"s": s, "n": n} for n in range(7, 12)])
    yield store
    await store.close()


async def test_rotate_converts_plaintext_and_old_keys(
    mixed: SessionStore, engine: AsyncEngine, names: TableNames
) -> None:
    assert (await mixed.rotate_keys("b", dry_run=True)).remaining == 36
    assert (await mixed.rotate_keys("a", dry_run=True)).remaining == 21  # the plaintext ones
    seen: list[int] = []
    report = await mixed.rotate_keys("b", batch_size=5, progress=seen.append)
    assert (report.rotated, report.changed, report.remaining) == (36, 0, 0)
    assert report.batches == 8
    assert sum(seen) == 36
    assert_all_under(await stored(engine, names), BOTH, "b")
    for s in range(3):
        assert await mixed.session(f"s{s}").get_items() == [{"s": s, "n": n} for n in range(12)]
    # resumable and idempotent: nothing is left, nothing is sealed twice
    again = await mixed.rotate_keys("b", batch_size=5)
    assert (again.rotated, again.remaining) == (0, 0)
    # the old key can go
    only_b = store_on(engine, names, Keyring({"b": KEY_B}, current="b"))
    assert await only_b.session("s1").get_items() == [{"s": 1, "n": n} for n in range(12)]


async def test_missing_key_stops_rotation_and_loses_nothing(
    mixed: SessionStore, engine: AsyncEngine, names: TableNames
) -> None:
    only_b = store_on(engine, names, Keyring({"b": KEY_B}, current="b"))
    with pytest.raises(MissingKeyError) as info:
        await only_b.rotate_keys("b", batch_size=4)
    assert info.value.key_id == "a"
    rows = await stored(engine, names)
    assert len(rows) == 36
    for s in range(3):
        assert await mixed.session(f"s{s}").get_items() == [{"s": s, "n": n} for n in range(12)]
    assert (await mixed.rotate_keys("b")).remaining == 0


async def test_rotation_needs_a_keyring_and_a_known_target(
    engine: AsyncEngine, names: TableNames
) -> None:
    with pytest.raises(ValueError, match="keyring"):
        await store_on(engine, names, None).rotate_keys("a")
    with pytest.raises(MissingKeyError, match="'zz'"):
        await store_on(engine, names, BOTH).rotate_keys("zz")
    with pytest.raises(ValueError, match="batch_size"):
        await store_on(engine, names, BOTH).rotate_keys("a", batch_size=0)


async def test_rotation_while_the_application_writes_and_pops(
    engine: AsyncEngine, names: TableNames
) -> None:
    """Appends (under the old key) and pops run between rotation batches: nothing is lost."""
    app = store_on(engine, names, BOTH)  # the application still writes under "a"
    rotator = store_on(engine, names, BOTH)
    for s in range(4):
        await app.session(f"s{s}").add_items([{"s": s, "n": n} for n in range(30)])
    expected = {s: [{"s": s, "n": n} for n in range(30)] for s in range(4)}
    examined = 0
    during: list[int] = []
    done = asyncio.Event()

    def progress(n: int) -> None:
        nonlocal examined
        examined += n

    async def application() -> None:
        n = 30
        while not done.is_set():
            for s in range(4):
                batch = [{"s": s, "n": n}]
                await app.session(f"s{s}").add_items(batch)
                expected[s] += batch
                popped = await app.session(f"s{s}").pop_item()
                assert popped == expected[s].pop()
                await app.session(f"s{s}").add_items(batch)
                expected[s] += batch
                during.append(examined)
            n += 1
            await asyncio.sleep(0)

    async def rotation() -> None:
        try:
            await rotator.rotate_keys("b", batch_size=3, progress=progress)
        finally:
            done.set()

    await asyncio.gather(application(), rotation())
    # the race happened: the application wrote while the rotation was part-way through
    assert any(0 < e < examined for e in during), (during[:5], examined)
    final = await rotator.rotate_keys("b", batch_size=50)
    assert final.remaining == 0
    for s in range(4):
        assert await rotator.session(f"s{s}").get_items() == expected[s]
    assert_all_under(await stored(engine, names), BOTH, "b")
    await app.close()
    await rotator.close()


async def test_a_row_changed_between_read_and_write_is_left_as_written(
    mixed: SessionStore, engine: AsyncEngine, names: TableNames
) -> None:
    """The compare-and-set write: a row popped or rewritten after the scan read it is skipped."""
    from agents_memory._sqlalchemy import _rotate  # noqa: PLC0415 - the batch writer itself

    backend = mixed._backend
    m = get_models(names).Message.__table__
    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                select(m.c.session_id, m.c.position, m.c.message_data).order_by(
                    m.c.session_id, m.c.position
                )
            )
        ).all()
    # meanwhile the application pops s2's newest item and rewrites s0's first row
    assert await mixed.session("s2").pop_item() == {"s": 2, "n": 11}
    rewritten = BOTH.encrypt('{"s":0,"n":0}')
    async with engine.begin() as conn:
        first = m.c.session_id == rows[0][0], m.c.position == rows[0][1]
        await conn.execute(m.update().where(*first).values(message_data=rewritten))
    write = (
        m.update()
        .where(
            m.c.session_id == _rotate.bindparam("rsid"),
            m.c.position == _rotate.bindparam("rpos"),
            m.c.message_data == _rotate.bindparam("old"),
        )
        .values(message_data=_rotate.bindparam("new"))
    )
    done, tried = await _rotate._write_batch(backend, write, BOTH.with_current("b"), rows)
    assert (done, tried) == (34, 36)
    async with engine.connect() as conn:
        found = (await conn.execute(select(m.c.session_id, m.c.position, m.c.message_data))).all()
    after = {(r[0], int(r[1])): str(r[2]) for r in found}
    assert after[rows[0][0], int(rows[0][1])] == rewritten  # the newer value was not overwritten
    assert (rows[-1][0], int(rows[-1][1])) not in after  # the popped row was not brought back
    assert (await mixed.rotate_keys("b")).remaining == 0
    assert await mixed.session("s0").get_items() == [{"s": 0, "n": n} for n in range(12)]
