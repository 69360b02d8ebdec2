"""Session metadata: free-form JSON tags on a session, and filters to find sessions by them.

Kept apart from the hot path: these are the operations revision 0002 added.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from typing import Any

from sqlalchemy import ColumnElement, Executable, Table, and_, bindparam, func, select, type_coerce
from sqlalchemy.dialects import postgresql, sqlite

from agents_memory._codec import encode_item
from agents_memory._tables import TableNames
from agents_memory.models import get_models

_FILTER_KEY = re.compile(r'[^"\\\x00-\x1f]{1,255}\Z')
FilterValue = str | int | float | bool


def validate_metadata(metadata: object) -> dict[str, Any]:
    """The same JSON rule as items: a dict that round-trips exactly, else a typed error."""
    encode_item(metadata, index=0)
    assert isinstance(metadata, dict)  # noqa: S101 - encode_item raised otherwise
    return dict(metadata)


@functools.cache
def _statements(names: TableNames, dialect: str) -> tuple[Executable, Executable]:
    sessions: Table = get_models(names).Session.__table__
    sid = bindparam("sid", type_=sessions.c.session_id.type)
    meta = bindparam("meta", type_=sessions.c["metadata"].type)
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    upsert = (
        insert(sessions)
        .values(session_id=sid, metadata=meta)
        .on_conflict_do_update(
            index_elements=[sessions.c.session_id],
            set_={"metadata": meta, "updated_at": func.current_timestamp()},
        )
    )
    read = select(sessions.c["metadata"]).where(sessions.c.session_id == sid)
    return upsert, read


def set_metadata_statement(names: TableNames, dialect: str) -> Executable:
    """Create-or-replace a session's metadata (params ``sid``, ``meta``); bumps ``updated_at``."""
    return _statements(names, dialect)[0]


def get_metadata_statement(names: TableNames, dialect: str) -> Executable:
    """Read a session's metadata (param ``sid``)."""
    return _statements(names, dialect)[1]


def metadata_filter(
    sessions: Table, dialect: str, wanted: Mapping[str, FilterValue]
) -> ColumnElement[bool]:
    """Sessions whose metadata has every key of ``wanted`` with exactly that scalar value."""
    column = sessions.c["metadata"]
    if not isinstance(wanted, Mapping) or not wanted:
        msg = "metadata filter must be a non-empty dict of key -> str/int/float/bool"
        raise ValueError(msg)
    for key, value in wanted.items():
        if not isinstance(key, str) or not _FILTER_KEY.match(key):
            msg = (
                f"metadata filter key {key!r} must be a non-empty str without quotes or backslashes"
            )
            raise ValueError(msg)
        if not isinstance(value, FilterValue):
            msg = f"metadata filter value for {key!r} must be str, int, float or bool"
            raise TypeError(msg)
    if dialect == "postgresql":
        # JSONB @> containment (a GIN index on the column would serve it).
        return type_coerce(column, postgresql.JSONB()).contains(dict(wanted))
    conditions: list[ColumnElement[bool]] = []
    for key, value in wanted.items():
        path = "$." + json.dumps(key)
        kind = func.json_type(column, path)
        if isinstance(value, bool):
            conditions.append(kind == ("true" if value else "false"))
        elif isinstance(value, str):
            conditions += [kind == "text", func.json_extract(column, path) == value]
        else:
            conditions += [kind.in_(["integer", "real"]), func.json_extract(column, path) == value]
    return and_(*conditions)
