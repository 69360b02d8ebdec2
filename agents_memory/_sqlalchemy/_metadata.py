"""Session metadata: free-form JSON tags on a session, and filters to find sessions by them.

Kept apart from the hot path: these are the operations revision 0002 added.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Executable,
    Table,
    and_,
    bindparam,
    func,
    select,
    type_coerce,
)
from sqlalchemy.dialects import mysql, postgresql, sqlite

from agents_memory._codec import encode_item
from agents_memory._tables import TableNames
from agents_memory.models import current_timestamp, get_models

_FILTER_KEY = re.compile(r'[^"\\\x00-\x1f]{1,255}\Z')
FilterValue = str | int | float | bool


def validate_metadata(metadata: object) -> dict[str, Any]:
    """The same JSON rule as items: a dict that round-trips exactly, else a typed error.

    Metadata lives in a JSON column, which is stricter than an item's text:
    Postgres' JSONB refuses NUL characters and lone surrogates, MySQL/MariaDB
    refuse lone surrogates. Such strings are refused up front on every backend.
    """
    encode_item(metadata, index=0)
    assert isinstance(metadata, dict)  # noqa: S101 - encode_item raised otherwise
    stack: list[Any] = [metadata]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack += [*value.keys(), *value.values()]
        elif isinstance(value, list | tuple):
            stack += value
        elif isinstance(value, str):
            _check_json_text(value)
    return dict(metadata)


def _check_json_text(value: str) -> None:
    if "\x00" in value:
        msg = "metadata strings must not contain NUL characters (JSON columns cannot store them)"
        raise ValueError(msg)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        msg = "metadata strings must be valid Unicode text (one holds a lone surrogate)"
        raise ValueError(msg) from None


@functools.cache
def _statements(names: TableNames, dialect: str) -> tuple[Executable, Executable]:
    sessions: Table = get_models(names).Session.__table__
    sid = bindparam("sid", type_=sessions.c.session_id.type)
    meta = bindparam("meta", type_=sessions.c["metadata"].type)
    read = select(sessions.c["metadata"]).where(sessions.c.session_id == sid)
    if dialect == "mysql":
        return _mysql_upsert(sessions, sid, meta), read
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    upsert = (
        insert(sessions)
        .values(session_id=sid, metadata=meta)
        .on_conflict_do_update(
            index_elements=[sessions.c.session_id],
            set_={"metadata": meta, "updated_at": func.current_timestamp()},
        )
    )
    return upsert, read


def _mysql_upsert(sessions: Table, sid: BindParameter[str], meta: BindParameter[Any]) -> Executable:
    return (
        mysql.insert(sessions)
        .values(session_id=sid, metadata=meta)
        .on_duplicate_key_update(metadata=meta, updated_at=current_timestamp())
    )


def set_metadata_statement(names: TableNames, dialect: str) -> Executable:
    """Create-or-replace a session's metadata (params ``sid``, ``meta``); bumps ``updated_at``."""
    return _statements(names, dialect)[0]


def get_metadata_statement(names: TableNames, dialect: str) -> Executable:
    """Read a session's metadata (param ``sid``)."""
    return _statements(names, dialect)[1]


def _validate_filter(wanted: object) -> Mapping[str, FilterValue]:
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
        if isinstance(value, str):
            _check_json_text(value)
        if isinstance(value, float) and not math.isfinite(value):
            msg = f"metadata filter value for {key!r} must be finite (metadata holds no NaN)"
            raise ValueError(msg)
    return wanted


def metadata_filter(
    sessions: Table, dialect: str, wanted: Mapping[str, FilterValue]
) -> ColumnElement[bool]:
    """Sessions whose metadata has every key of ``wanted`` with exactly that scalar value."""
    column = sessions.c["metadata"]
    wanted = _validate_filter(wanted)
    if dialect == "postgresql":
        # JSONB @> containment (a GIN index on the column would serve it).
        return type_coerce(column, postgresql.JSONB()).contains(dict(wanted))
    if dialect == "mysql":
        return _mysql_filter(column, wanted)
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


def _mysql_json_types(value: FilterValue) -> tuple[str, ...]:
    """The ``JSON_TYPE`` names a stored value may have to equal ``value`` (MariaDB's too)."""
    if isinstance(value, bool):
        return ("BOOLEAN",)
    if isinstance(value, str):
        return ("STRING",)
    return ("INTEGER", "UNSIGNED INTEGER", "DOUBLE", "DECIMAL")


def _mysql_filter(
    column: ColumnElement[Any], wanted: Mapping[str, FilterValue]
) -> ColumnElement[bool]:
    """``JSON_CONTAINS`` at each key's path, with ``JSON_TYPE`` pinning the kind of value.

    On a scalar, containment is JSON equality (exact strings, numbers by value);
    the type check keeps ``True`` from matching ``1`` and a string from matching
    an array that holds it (MySQL's containment looks inside arrays). Works on
    MySQL's JSON type and on MariaDB's JSON-checked ``LONGTEXT`` alike.
    """
    conditions: list[ColumnElement[bool]] = []
    for key, value in wanted.items():
        path = "$." + json.dumps(key, ensure_ascii=False)  # the key has no quote or backslash
        kind = func.json_type(func.json_extract(column, path))
        candidate = json.dumps(value, ensure_ascii=False)
        conditions += [
            kind.in_(_mysql_json_types(value)),
            func.json_contains(column, candidate, path) == 1,
        ]
    return and_(*conditions)
