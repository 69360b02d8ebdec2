"""The SQL the stdlib ``SQLiteSession`` runs, compiled from the one schema and statement set.

``SQLiteSession`` talks to ``sqlite3`` directly, but it must write exactly the
tables ``SQLAlchemySession`` reads (and the reverse). Rather than define the
schema and statements a second time, the DDL is compiled once per table-name set
from the ORM models, and the operations are the driver path's own ``DriverSQL``
texts, with ``:name`` parameters that ``sqlite3`` executes as they are.
"""

from __future__ import annotations

import dataclasses
import functools

from sqlalchemy.dialects import sqlite
from sqlalchemy.schema import CreateIndex, CreateTable

from agents_memory import migrations
from agents_memory._sqlalchemy._statements import DriverSQL, driver_sql
from agents_memory._tables import TableNames
from agents_memory.models import get_models

_DIALECT = sqlite.dialect(paramstyle="named")


@dataclasses.dataclass(frozen=True, slots=True)
class SQLiteSQL:
    """Everything ``SQLiteSession`` executes for one table-name set."""

    create_schema: tuple[str, ...]
    """``CREATE TABLE/INDEX IF NOT EXISTS`` for both tables, in dependency order."""
    sessions_table_exists: str
    """A query with a row when the sessions table already exists (then nothing is stamped)."""
    stamp_head: tuple[str, ...]
    """Create the lineage's version table and record the head revision, as ``upgrade`` would."""
    driver: DriverSQL
    """The operations, as the SQLAlchemy store's SQLite driver path runs them."""


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
        driver=driver_sql(names, "sqlite"),
    )
