"""Operational faults become typed errors that say what happened and what to do."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

import agents_memory._sqlalchemy._engine as engine_module
from agents_memory import DatabaseBusyError, DatabaseConnectionError, SessionStore


async def test_sqlite_locked_past_busy_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holding the write lock too long: DatabaseBusyError, nothing written."""
    monkeypatch.setattr(engine_module, "SQLITE_BUSY_TIMEOUT_MS", 200)
    path = tmp_path / "busy.db"
    async with SessionStore.from_url(f"sqlite:///{path}", create_tables=True) as store:
        await store.session("s").add_items([{"n": 1}])
        holder = sqlite3.connect(path)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(DatabaseBusyError, match=r"busy\.db.*can be retried"):
                await store.session("s").add_items([{"n": 2}])
        finally:
            holder.rollback()
            holder.close()
        assert await store.session("s").get_items() == [{"n": 1}]


async def test_sqlite_path_that_cannot_be_opened(tmp_path: Path) -> None:
    """A SQLite file in a missing directory: DatabaseConnectionError naming the path."""
    url = f"sqlite:///{tmp_path / 'missing' / 'x.db'}"
    async with SessionStore.from_url(url) as store:
        with pytest.raises(DatabaseConnectionError, match=r"missing/x\.db.*directory exists"):
            await store.session("s").get_items()
        await asyncio.sleep(0.1)  # aiosqlite's worker thread stops after a failed connect
