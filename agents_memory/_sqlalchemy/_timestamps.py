"""The one rule for timestamps we write ourselves (copies and imports keep their original times).

The schema stores naive UTC times. How a database takes one as a parameter is
its module's rule (``Database.stamp``: SQLite keeps its own text format).
"""

from __future__ import annotations

import datetime as dt


def naive_utc(value: object, *, what: str = "timestamp") -> dt.datetime:
    """Return ``value`` as a naive UTC datetime; aware times are converted, others rejected."""
    if not isinstance(value, dt.datetime):
        msg = f"{what} must be a datetime, got {type(value).__name__}"
        raise TypeError(msg)
    if value.tzinfo is not None and value.utcoffset() is not None:
        return value.astimezone(dt.UTC).replace(tzinfo=None)
    return value.replace(tzinfo=None)


def utcnow() -> dt.datetime:
    """Now, as the schema keeps times: naive UTC."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def check_ttl(ttl: object, *, what: str = "ttl") -> dt.timedelta | None:
    """A time-to-live: a positive ``timedelta``, or ``None`` (no expiry); else ``ValueError``."""
    if ttl is not None and (not isinstance(ttl, dt.timedelta) or ttl <= dt.timedelta(0)):
        msg = f"{what} must be a positive datetime.timedelta or None, got {ttl!r}"
        raise ValueError(msg)
    return ttl
