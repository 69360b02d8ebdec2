"""Counts past a 64-bit SQL integer, and SQLite paths that are not database files."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agents_memory import DatabaseConnectionError, SessionStore, SQLiteSession
from agents_memory._sqlalchemy._bulk import bulk_for

TOO_BIG = [2**63, 2**64, 10**30]


@pytest.mark.parametrize("n", TOO_BIG)
async def test_counts_past_64_bits_are_a_value_error(store: SessionStore, n: int) -> None:
    """limit, batch_size and largest of 2**63 or more: a ValueError naming them, on every DB."""
    session = store.session("a")
    await session.add_items([{"x": 1}])
    with pytest.raises(ValueError, match=r"limit must be at most 9223372036854775807"):
        await session.get_items(limit=n)
    with pytest.raises(ValueError, match=r"batch_size must be at most"):
        await anext(aiter(session.iter_items(batch_size=n)))
    with pytest.raises(ValueError, match=r"largest must be at most"):
        await store.stats(largest=n)
    with pytest.raises(ValueError, match=r"batch_size must be at most"):
        await anext(aiter(bulk_for(store).rows("a", batch_size=n)))
    # the largest count that fits still works
    assert await session.get_items(limit=2**63 - 1) == [{"x": 1}]
    assert (await store.stats(largest=2**63 - 1)).largest == [("a", 1)]


@pytest.mark.parametrize("create_tables", [False, True])
async def test_a_file_that_is_not_sqlite_names_the_path(
    tmp_path: Path, create_tables: bool
) -> None:
    """A text file as the database: a typed error naming the path; the file is left as it was."""
    path = tmp_path / "notes.txt"
    path.write_text("not a database\n" * 100)
    async with SessionStore.from_url(f"sqlite:///{path}", create_tables=create_tables) as store:
        with pytest.raises(DatabaseConnectionError) as info:
            await store.session("a").get_items()
        await asyncio.sleep(0.1)  # aiosqlite's worker thread stops after a failed connect
    message = str(info.value)
    assert str(path) in message
    assert "not a database" in message
    assert "server" not in message
    assert path.read_text() == "not a database\n" * 100


async def test_a_directory_as_the_database_names_the_path(tmp_path: Path) -> None:
    """A directory as the database: a typed error naming it and saying it is a directory."""
    async with SessionStore.from_url(f"sqlite:///{tmp_path}", create_tables=True) as store:
        with pytest.raises(DatabaseConnectionError) as info:
            await store.session("a").get_items()
        await asyncio.sleep(0.1)  # aiosqlite's worker thread stops after a failed connect
    message = str(info.value)
    assert str(tmp_path) in message
    assert "is a directory" in message
    assert "server" not in message


@pytest.mark.parametrize("n", TOO_BIG)
async def test_sqlite_session_counts_past_64_bits_are_a_value_error(n: int) -> None:
    """The stdlib class refuses the same limits with the same ValueError (not OverflowError)."""
    with SQLiteSession("a") as session:
        await session.add_items([{"x": 1}])
        with pytest.raises(ValueError, match=r"limit must be at most 9223372036854775807"):
            await session.get_items(limit=n)
        assert await session.get_items(limit=2**63 - 1) == [{"x": 1}]


def test_sqlite_session_on_a_file_that_is_not_sqlite_names_the_path(tmp_path: Path) -> None:
    """SQLiteSession on a text file: the same typed error as the SQLAlchemy classes; file kept."""
    path = tmp_path / "notes.txt"
    path.write_text("not a database\n" * 100)
    with pytest.raises(DatabaseConnectionError) as info:
        SQLiteSession("a", path)
    message = str(info.value)
    assert str(path) in message
    assert "not a SQLite database" in message
    assert "server" not in message
    assert path.read_text() == "not a database\n" * 100


def test_sqlite_session_on_a_directory_names_the_path(tmp_path: Path) -> None:
    """SQLiteSession on a directory: a typed error naming it and saying it is a directory."""
    with pytest.raises(DatabaseConnectionError) as info:
        SQLiteSession("a", tmp_path)
    message = str(info.value)
    assert str(tmp_path) in message
    assert "is a directory" in message
    assert list(tmp_path.iterdir()) == []
