"""The one rule for timestamps we write ourselves (copies and imports keep their original times).

The schema stores naive UTC times, as ``CURRENT_TIMESTAMP`` does. On SQLite the
column holds text and is compared as text, so a time we write must look exactly
like one SQLite wrote: ``YYYY-MM-DD HH:MM:SS``, with ``.ffffff`` only when there
are microseconds. Otherwise ordering and keyset cursors would compare unlike strings.
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


def sqlite_text(value: dt.datetime) -> str:
    """The text SQLite's ``CURRENT_TIMESTAMP`` would have stored for ``value``."""
    fmt = "%Y-%m-%d %H:%M:%S.%f" if value.microsecond else "%Y-%m-%d %H:%M:%S"
    return value.strftime(fmt)
