"""The SQL the stdlib ``SQLiteSession`` runs, compiled from the one schema and statement set.

``SQLiteSession`` talks to ``sqlite3`` directly, but it must write exactly the
tables ``SQLAlchemySession`` reads (and the reverse). Rather than define the
schema and statements a second time, they are compiled once per table-name set
from the ORM models and from ``statements_for(names, "sqlite")``, into plain
strings with ``:name`` parameters that ``sqlite3`` executes as they are.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from sqlalchemy import ClauseElement, Executable
from sqlalchemy.dialects import sqlite
from sqlalchemy.schema import CreateIndex, CreateTable

from agents_memory import migrations
from agents_memory._sqlalchemy._statements import statements_for
from agents_memory._tables import TableNames
from agents_memory.models import get_models

_DIALECT = sqlite.dialect(paramstyle="named")


@dataclasses.dataclass(frozen=True, slots=True)
class Compiled:
    """One statement as ``sqlite3`` runs it, with the values SQLAlchemy bound itself."""

    sql: str
    defaults: dict[str, Any]
    """Parameters fixed at build time (e.g. ``OFFSET 0``); callers' values are merged over them."""

    def params(self, **values: Any) -> dict[str, Any]:  # noqa: ANN401
        """The full parameter dict for one execution."""
        return {**self.defaults, **values} if self.defaults else values


def _compile(statement: Executable) -> Compiled:
    if not isinstance(statement, ClauseElement):  # every statement is; this narrows the type
        msg = f"cannot compile {type(statement).__name__}"
        raise TypeError(msg)
    compiled = statement.compile(dialect=_DIALECT)
    # Unbound (caller-supplied) parameters compile to None; only fixed ones are kept.
    defaults = {k: v for k, v in compiled.params.items() if v is not None}
    return Compiled(str(compiled), defaults)


@dataclasses.dataclass(frozen=True, slots=True)
class SQLiteSQL:
    """Everything ``SQLiteSession`` executes for one table-name set."""

    create_schema: tuple[str, ...]
    """``CREATE TABLE/INDEX IF NOT EXISTS`` for both tables, in dependency order."""
    sessions_table_exists: str
    """A query with a row when the sessions table already exists (then nothing is stamped)."""
    stamp_head: tuple[str, ...]
    """Create the lineage's version table and record the head revision, as ``upgrade`` would."""
    upsert_session: Compiled
    insert_messages: Compiled
    select_all: Compiled
    select_latest: Compiled
    select_older: Compiled
    pop: Compiled
    delete_messages: Compiled
    delete_session: Compiled


@functools.cache
def sql_for(names: TableNames) -> SQLiteSQL:
    """Compile (once per name set) the schema and statements shared with ``SQLAlchemySession``."""
    ddl: list[str] = []
    for table in get_models(names).metadata.sorted_tables:
        ddl.append(str(CreateTable(table, if_not_exists=True).compile(dialect=_DIALECT)).strip())
        ddl.extend(
            str(CreateIndex(index, if_not_exists=True).compile(dialect=_DIALECT)).strip()
            for index in sorted(table.indexes, key=lambda ix: str(ix.name))
        )
    st = statements_for(names, "sqlite")
    version = names.version_table  # validated identifier, derived from TableNames
    return SQLiteSQL(
        create_schema=tuple(ddl),
        sessions_table_exists=(
            f"SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '{names.sessions}'"
        ),
        stamp_head=(
            (
                f"CREATE TABLE IF NOT EXISTS {version} (version_num VARCHAR(32) NOT NULL, "
                f"CONSTRAINT {version}_pkc PRIMARY KEY (version_num))"
            ),
            (
                f"INSERT INTO {version} (version_num) SELECT '{migrations.head()}' "
                f"WHERE NOT EXISTS (SELECT 1 FROM {version})"
            ),
        ),
        upsert_session=_compile(st.upsert_session),
        insert_messages=_compile(st.insert_messages),
        select_all=_compile(st.select_all),
        select_latest=_compile(st.select_latest),
        select_older=_compile(st.select_older),
        pop=_compile(st.pop),
        delete_messages=_compile(st.delete_messages),
        delete_session=_compile(st.delete_session),
    )
