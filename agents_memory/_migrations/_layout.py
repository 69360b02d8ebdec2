"""The messages table's layout: plain, or hash-partitioned by session id (Postgres).

A distributed engine (Citus, YugabyteDB, CockroachDB) shards a table by a key and
wants that key in every primary and unique key; Postgres' own declarative hash
partitioning imposes the same rule, so a partitioned layout on one Postgres is both
a way to keep each session's rows together as a table grows and the proof that
the schema is shardable. The layout is chosen when the revision that builds the
messages table on session-led keys (0006) runs, with ``partitions=N`` (an
argument, ``db upgrade --partitions N``, ``alembic -x partitions=N``) or
``$AGENTS_MEMORY_PARTITIONS``; afterwards the table keeps it: asking a database
already past that revision for another layout is an error that says how to get it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

from sqlalchemy.exc import CompileError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.ddl import ExecutableDDLElement

from agents_memory._tables import TableNames

PARTITIONS_ENV = "AGENTS_MEMORY_PARTITIONS"
"""The environment variable read when no ``partitions=`` / ``--partitions`` is given."""

PARTITIONS_KEY = "agents_memory_partitions"
"""Key under which the revision scripts find the layout: ``op.get_context().opts[...]``."""

BUILT_AT = "0006"
"""The revision that builds the messages table on session-led keys, in the layout asked for."""

MIN_PARTITIONS = 2
MAX_PARTITIONS = 1024
"""Bounds on ``N``: one partition is the plain table with extra steps; past 1,024 the
planner's per-partition costs dominate every statement that cannot prune."""


@functools.cache
def partition_names(names: TableNames) -> frozenset[str]:
    """Every name a partition of ``names``' messages table can have: tools must skip them.

    Partitions are the layout's, not tables of the set (``TableNames.tables``), so the
    comparison with the models and a host application's autogenerate leave them out.
    """
    return frozenset(names.partition(i) for i in range(MAX_PARTITIONS))


@dataclasses.dataclass(frozen=True, slots=True)
class Layout:
    """The layout asked for: ``partitions`` (``None``: plain) and whether it was explicit.

    An explicit ``partitions=`` on a database without hash partitions is an error;
    the environment variable is a deployment default for Postgres databases, so
    SQLite and MySQL migrations beside them keep their plain layout.
    """

    partitions: int | None = None
    explicit: bool = False


def resolve_layout(given: int | None) -> Layout:
    """``given`` (an argument), else ``$AGENTS_MEMORY_PARTITIONS``, else plain.

    ``0`` (from either) also means plain. Anything else outside 2..1,024 is a
    ``ValueError`` naming where it came from, raised before a connection is opened.
    """
    return Layout(_partitions(given), explicit=given is not None)


def _partitions(given: int | None) -> int | None:
    source = "partitions"
    value: object = given
    if value is None:
        value = os.environ.get(PARTITIONS_ENV) or None
        source = f"${PARTITIONS_ENV}"
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                msg = f"invalid {source} {value!r}: a whole number of partitions (2 to 1024)"
                raise ValueError(msg) from None
    if value is None or value == 0:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"partitions must be an int (2 to 1024), got {type(value).__name__}"
        raise TypeError(msg)
    if not MIN_PARTITIONS <= value <= MAX_PARTITIONS:
        msg = (
            f"invalid {source} {value}: use 2 to {MAX_PARTITIONS} hash partitions "
            "(0 or none: a plain table)"
        )
        raise ValueError(msg)
    return value


class CreateHashPartition(ExecutableDDLElement):
    """``CREATE TABLE <name> PARTITION OF <parent> FOR VALUES WITH (MODULUS n, REMAINDER r)``.

    SQLAlchemy has no construct for a partition; this one lets its compiler quote
    both names (mixed case, reserved words) instead of pasting them into a string.
    Postgres only: any other dialect refuses to compile it.
    """

    inherit_cache = False

    def __init__(self, name: str, parent: str, modulus: int, remainder: int) -> None:
        self.name = name
        self.parent = parent
        self.modulus = int(modulus)
        self.remainder = int(remainder)


@compiles(CreateHashPartition)
def _create_partition_elsewhere(_element: CreateHashPartition, compiler: Any, **_kw: Any) -> str:  # noqa: ANN401
    msg = f"hash partitions are a Postgres layout, not {compiler.dialect.name}'s"
    raise CompileError(msg)


@compiles(CreateHashPartition, "postgresql")
def _create_partition(element: CreateHashPartition, compiler: Any, **_kw: Any) -> str:  # noqa: ANN401
    quote = compiler.preparer.quote
    return (
        f"CREATE TABLE {quote(element.name)} PARTITION OF {quote(element.parent)} "
        f"FOR VALUES WITH (MODULUS {element.modulus}, REMAINDER {element.remainder})"
    )
