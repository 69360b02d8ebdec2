"""The stdlib ``SQLiteSession`` with ``encryption=``: same envelopes as the SQLAlchemy classes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from agents_memory import DecryptionError, Keyring, MissingKeyError, SessionStore, SQLiteSession

KEY = Keyring.generate_key()


async def test_sqlite_session_round_trip_and_shared_format(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    ring = Keyring({"k": KEY}, current="k")
    with SQLiteSession("u", db, encryption=ring) as session:
        await session.add_items([{"n": 1}, {"n": 2}, {"n": 3}])
        assert await session.get_items(limit=2) == [{"n": 2}, {"n": 3}]
        assert await session.pop_item() == {"n": 3}
    conn = sqlite3.connect(db)
    rows = [r[0] for r in conn.execute("SELECT message_data FROM agent_messages")]
    conn.close()
    assert all(r.startswith("am1:k:") for r in rows)
    async with SessionStore.from_url(f"sqlite:///{db}", encryption=ring) as store:
        assert await store.session("u").get_items() == [{"n": 1}, {"n": 2}]
    with SQLiteSession("u", db) as plain:
        with pytest.raises(MissingKeyError):
            await plain.get_items()
        with pytest.raises(MissingKeyError):
            await plain.pop_item()
        with pytest.raises(MissingKeyError):
            await plain.clear_session()
    wrong = Keyring({"k": Keyring.generate_key()}, current="k")
    with SQLiteSession("u", db, encryption=wrong) as bad:
        with pytest.raises(DecryptionError):
            await bad.pop_item()
        with pytest.raises(DecryptionError):
            await bad.clear_session()
    with SQLiteSession("u", db, encryption=ring) as session:
        assert await session.get_items() == [{"n": 1}, {"n": 2}]
        await session.clear_session()
        assert await session.get_items() == []


def test_encryption_must_be_a_keyring() -> None:
    with pytest.raises(TypeError, match="Keyring"):
        SQLiteSession("u", encryption="secret")  # type: ignore[arg-type]


async def test_sqlite_session_replace_items_seals_and_refuses_what_it_cannot_open(
    tmp_path: Path,
) -> None:
    """replace_items writes envelopes; with a wrong key it changes nothing (as clear)."""
    db = tmp_path / "r.db"
    ring = Keyring({"k": KEY}, current="k")
    with SQLiteSession("u", db, encryption=ring) as session:
        await session.add_items([{"n": 1}, {"n": 2}])
        await session.replace_items([{"n": 3}])
        assert await session.get_items() == [{"n": 3}]

    def rows() -> list[str]:
        conn = sqlite3.connect(db)
        try:
            return [r[0] for r in conn.execute("SELECT message_data FROM agent_messages")]
        finally:
            conn.close()

    before = rows()
    assert len(before) == 1
    assert before[0].startswith("am1:k:")
    wrong = Keyring({"k": Keyring.generate_key()}, current="k")
    with SQLiteSession("u", db, encryption=wrong) as bad, pytest.raises(DecryptionError):
        await bad.replace_items([{"n": 4}])
    with SQLiteSession("u", db) as plain, pytest.raises(MissingKeyError):
        await plain.replace_items([{"n": 5}])
    assert rows() == before
