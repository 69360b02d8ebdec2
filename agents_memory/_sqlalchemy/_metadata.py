"""Session metadata: free-form JSON tags on a session, and filters to find sessions by them.

Kept apart from the hot path: these are the operations revision 0002 added.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from sqlalchemy import ColumnElement, Executable, Table, bindparam, select

from agents_memory._codec import encode_item
from agents_memory._databases.base import Database

_FILTER_KEY = re.compile(r'[^"\\\x00-\x1f]{1,255}\Z')
FilterValue = str | int | float | bool


def validate_metadata(metadata: object) -> dict[str, Any]:
    """The same JSON rule as items: a dict that round-trips exactly, else a typed error.

    Metadata lives in a JSON column, which is stricter than an item's text:
    Postgres' JSONB refuses NUL characters and lone surrogates, MySQL/MariaDB
    refuse lone surrogates. Such strings are refused up front on every backend.
    JSONB also keeps numbers as decimals and writes them back without exponent:
    a float Python writes with a positive exponent (``1e16`` and up, such as
    ``2.5e30``) comes back as an int (``1e308`` as ``10**308``). Those floats
    are refused too, on every backend, so a store can be copied anywhere.
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
        elif isinstance(value, float):
            _check_json_float(value)
    return dict(metadata)


def _check_json_float(value: float) -> None:
    if "e+" in repr(value):
        msg = (
            f"metadata number {value!r} cannot be stored exactly (Postgres' JSONB gives a float "
            "this large back as an integer); store it as an int or as a string"
        )
        raise ValueError(msg)


def _check_json_text(value: str) -> None:
    if "\x00" in value:
        msg = "metadata strings must not contain NUL characters (JSON columns cannot store them)"
        raise ValueError(msg)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        msg = "metadata strings must be valid Unicode text (one holds a lone surrogate)"
        raise ValueError(msg) from None


def get_metadata_statement(sessions: Table) -> Executable:
    """Read a session's metadata (param ``sid``); the upsert is the database module's."""
    sid = bindparam("sid", type_=sessions.c.session_id.type)
    return select(sessions.c["metadata"]).where(sessions.c.session_id == sid)


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
    db: type[Database], sessions: Table, wanted: Mapping[str, FilterValue]
) -> ColumnElement[bool]:
    """Sessions whose metadata has every key of ``wanted`` with exactly that scalar value.

    The filter is validated here, the same for every database; the SQL is the
    database module's (JSONB containment, ``JSON_CONTAINS``, ``json_extract``).
    """
    return db.metadata_filter(sessions, _validate_filter(wanted))
