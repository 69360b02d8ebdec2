"""Drive the ``agents-memory`` command in-process (typer's runner) against the backend under test.

The command runs ``asyncio.run`` itself, so it is invoked from a worker thread
while the test's own loop keeps its fixtures (``store``) usable for setting up
and checking data. Postgres tables are dropped by the ``engine`` fixture.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine
from typer.testing import CliRunner, Result

from agents_memory import SessionStore, TableNames, migrations
from agents_memory._cli import app
from agents_memory._sqlalchemy._bulk import ItemRecord, SessionRecord, SessionWrite, bulk_for


@dataclasses.dataclass
class Cli:
    """The command, pointed at one store."""

    url: str
    names: TableNames

    @property
    def store_args(self) -> list[str]:
        """The options that select this store."""
        return [
            "--url",
            self.url,
            "--sessions-table",
            self.names.sessions,
            "--messages-table",
            self.names.messages,
        ]

    async def raw(self, *args: str, input: str | None = None) -> Result:  # noqa: A002
        """Run ``agents-memory ARGS`` exactly as given."""
        runner = CliRunner()
        env = {"AGENTS_MEMORY_URL": None, "COLUMNS": "200"}
        return await asyncio.to_thread(
            runner.invoke, app, list(args), input=input, env=env, catch_exceptions=False
        )

    async def __call__(
        self,
        *args: str,
        input: str | None = None,  # noqa: A002 - the runner's name for it
        code: int = 0,
    ) -> Result:
        """Run ``agents-memory`` with this store's options and ``args``; check the exit code."""
        result = await self.raw(*self.store_args, *args, input=input)
        assert result.exit_code == code, (
            f"exit {result.exit_code} != {code}\nstdout: {result.stdout}\nstderr: {result.stderr}"
        )
        return result

    async def json(self, *args: str) -> Any:
        """Run with ``--json`` and parse what it printed."""
        return json.loads((await self(*args, "--json")).stdout)


SESSIONS, ITEMS = 200, 50
"""The size of the copy tests' source store."""


@pytest.fixture
async def sqlite_source(tmp_path: Path, names: TableNames) -> str:
    """A SQLite store of 200 sessions x 50 items with distinct times (microseconds) and metadata."""
    url = f"sqlite+aiosqlite:///{tmp_path / 'source.db'}"
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    await migrations.upgrade(url, **kw)
    t0 = dt.datetime.fromisoformat("2023-01-01 00:00:00")
    async with SessionStore.from_url(url, **kw) as store:
        bulk = bulk_for(store)
        writes = []
        for s in range(SESSIONS):
            start = t0 + dt.timedelta(minutes=s, microseconds=s)
            meta = {"user": f"u{s % 7}", "n": s} if s % 3 else None
            items = [
                ItemRecord(
                    {"role": "user" if i % 2 else "assistant", "content": f"s{s} i{i} ✓"},
                    start + dt.timedelta(seconds=i, microseconds=i),
                )
                for i in range(ITEMS)
            ]
            end = items[-1].created_at
            writes.append(SessionWrite(SessionRecord(f"session-{s:03}", start, end, meta), items))
            if len(writes) == 20:
                await bulk.write(writes)
                writes = []
        await bulk.write(writes)
    return url


@pytest.fixture
def cli(file_backend: Any, names: TableNames, engine: AsyncEngine) -> Cli:
    """The command on the backend under test (files and servers only), with this test's tables."""
    return Cli(file_backend.url, names)
