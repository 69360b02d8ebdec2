"""One migrator process for test_migration_lock (arguments: URL SESSIONS MESSAGES LOCK PAUSE).

Upgrades one lineage to head with ``lock=LOCK`` and says, on stdout, what it
reached: ``reached`` just before it asks SQLite for the file's write lock,
``holding`` once its ``SELECT`` of the migration lock row has returned (then,
with ``PAUSE`` = ``pause``, it waits for a line on stdin before it migrates), and
at the end ``done <number of CREATE TABLE statements it ran>``. The events are
SQLAlchemy's public ``before/after_cursor_execute``.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from sqlalchemy import event
from sqlalchemy.pool import NullPool

from agents_memory import TableNames, create_engine, migrations


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main(url: str, sessions: str, messages: str, lock: str, pause: bool) -> int:
    names = TableNames(sessions, messages)
    engine = create_engine(url, poolclass=NullPool)
    created = 0

    @event.listens_for(engine.sync_engine, "before_cursor_execute")
    def before(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.startswith("BEGIN IMMEDIATE"):
            say("reached")

    @event.listens_for(engine.sync_engine, "after_cursor_execute")
    def after(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        nonlocal created
        head = statement.lstrip().upper()
        if names.migration_lock_table in statement and head.startswith("SELECT"):
            say("holding")
            if pause:
                sys.stdin.readline()
        elif head.startswith("CREATE TABLE") and names.migration_lock_table not in statement:
            created += 1

    try:
        await migrations.upgrade(
            engine, sessions_table=sessions, messages_table=messages, lock=lock
        )
    finally:
        await engine.dispose()
    say(f"done {created}")
    return 0


if __name__ == "__main__":
    url, sessions, messages, lock, pause = sys.argv[1:6]
    sys.exit(asyncio.run(main(url, sessions, messages, lock, pause == "pause")))
