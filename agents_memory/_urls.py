"""The one place where database URLs are normalised to an async driver and masked for display."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from agents_memory._errors import UnsupportedDatabaseError

if TYPE_CHECKING:
    from sqlalchemy.engine import URL

DEFAULT_URL = "sqlite+aiosqlite:///./agents_memory.db"
"""The embedded default: a SQLite file in the working directory."""

URL_ENV = "AGENTS_MEMORY_URL"
"""The environment variable the CLI and the Alembic environment read the URL from."""


def resolve_url(given: Mapping[str, str | None]) -> str:
    """``given["url"]`` (an option, ``-x url=…``), else ``$AGENTS_MEMORY_URL``, else the default."""
    return given.get("url") or os.environ.get(URL_ENV) or DEFAULT_URL


def _parsed(url: str | URL) -> URL | None:
    """``url`` as SQLAlchemy's ``URL``; ``None`` when it is not a URL at all.

    SQLAlchemy is imported here, not at module level, so that the CLI can show its
    help (which prints :data:`DEFAULT_URL`) without loading it.
    """
    from sqlalchemy.engine import make_url  # noqa: PLC0415 - see the docstring
    from sqlalchemy.exc import ArgumentError  # noqa: PLC0415

    try:
        return make_url(url) if isinstance(url, str) else url
    except (ArgumentError, ValueError):
        return None


# backend name -> the async driver we use for it
_ASYNC_DRIVERS: dict[str, str] = {
    "sqlite": "aiosqlite",
    "postgresql": "asyncpg",
    "mysql": "asyncmy",
    "mariadb": "asyncmy",
}
_BACKEND_ALIASES: dict[str, str] = {"postgres": "postgresql"}
# Another async driver's URL that we serve with ours (same server protocol, same behaviour).
_DRIVER_ALIASES: dict[tuple[str, str], str] = {
    ("mysql", "aiomysql"): "asyncmy",
    ("mariadb", "aiomysql"): "asyncmy",
}
MYSQL_FAMILY = frozenset({"mysql", "mariadb"})
"""Dialect names of the MySQL family (SQLAlchemy names a ``mariadb://`` engine ``mariadb``)."""


def supported_urls() -> str:
    """A human list of the URL schemes we accept, for error messages."""
    return ", ".join(f"{b}+{d}://" for b, d in _ASYNC_DRIVERS.items())


def _mysql_query(url: URL) -> URL:
    """Talk utf8mb4, and nothing else: any other charset loses or refuses characters.

    MySQL's ``utf8`` (``utf8mb3``) cannot hold 4-byte characters and ``latin1``
    far fewer; with a lax ``sql_mode`` the server stores ``?`` in their place
    (an emoji came back as ``????``), with a strict one each write fails.
    """
    charset = url.query.get("charset")
    if charset is None:
        return url.update_query_dict({"charset": "utf8mb4"})
    if isinstance(charset, str) and charset.lower() == "utf8mb4":
        return url
    msg = (
        f"charset={charset!s} in {mask_url(url)} cannot store every character agents_memory "
        "is given (emoji would come back as '?'); use charset=utf8mb4, or leave charset out"
    )
    raise UnsupportedDatabaseError(msg)


def normalize_url(url: str | URL) -> URL:
    """Map a plain or async URL onto the async driver we support; reject anything else.

    ``sqlite:///x.db`` becomes ``sqlite+aiosqlite:///x.db``, ``postgres://``
    or ``postgresql://`` become ``postgresql+asyncpg://`` and ``mysql://`` /
    ``mariadb://`` (or ``mysql+aiomysql://``) become ``mysql+asyncmy://`` /
    ``mariadb+asyncmy://`` with ``charset=utf8mb4``, so users can paste the URL
    their platform gives them.
    """
    parsed = _parsed(url)
    if parsed is None:
        msg = f"not a database URL: {mask_url(url)!s}; expected one of {supported_urls()}"
        raise UnsupportedDatabaseError(msg) from None
    backend, _, driver = parsed.drivername.partition("+")
    backend = _BACKEND_ALIASES.get(backend, backend)
    wanted = _ASYNC_DRIVERS.get(backend)
    driver = _DRIVER_ALIASES.get((backend, driver), driver)
    if wanted is None:
        msg = (
            f"unsupported database {backend!r} in {mask_url(parsed)}; supported: {supported_urls()}"
        )
        raise UnsupportedDatabaseError(msg)
    if driver and driver != wanted:
        msg = (
            f"unsupported driver {backend}+{driver} in {mask_url(parsed)}; "
            f"use {backend}+{wanted}:// (or plain {backend}://)"
        )
        raise UnsupportedDatabaseError(msg)
    normalized = parsed.set(drivername=f"{backend}+{wanted}")
    return _mysql_query(normalized) if backend in MYSQL_FAMILY else normalized


SECRET_QUERY_KEYS = frozenset({"password", "passwd", "sslpassword"})
"""Query parameters the drivers take as a password (``?password=…`` works like ``user:pw@``)."""

_MASK = "***"
_PLACEHOLDER = "AGENTSMEMORYMASKED"  # URL-safe, so rendering leaves it whole for the swap


def url_secrets(url: str | URL) -> set[str]:
    """Every secret a URL carries: its password and any password-like query value."""
    parsed = _parsed(url)
    if parsed is None:
        return set()
    found = {str(parsed.password)} if parsed.password else set()
    for key in SECRET_QUERY_KEYS & set(parsed.query):
        value = parsed.query[key]
        found.update(v for v in ((value,) if isinstance(value, str) else value) if v)
    return found


def mask_url(url: str | URL) -> str:
    """Render a URL with its password hidden, for errors, logs and reprs.

    A password given as a query parameter (``?password=…``) is hidden the same
    way. Text that is not a URL at all (no ``scheme://``) is shown as typed: it
    holds no credentials, and the user needs to see what was wrong with it.
    """
    parsed = _parsed(url)
    if parsed is None:
        # Not parseable: show only the scheme, never the rest (it may hold a secret).
        assert isinstance(url, str)  # noqa: S101 - a URL object always parses
        scheme, sep, _ = url.partition("://")
        return f"{scheme}{sep}{_MASK}" if sep else url
    hidden = SECRET_QUERY_KEYS & set(parsed.query)
    if not hidden:
        return parsed.render_as_string(hide_password=True)
    parsed = parsed.update_query_dict(dict.fromkeys(hidden, _PLACEHOLDER))
    return parsed.render_as_string(hide_password=True).replace(_PLACEHOLDER, _MASK)


def sqlite_file(url: URL) -> str | None:
    """The database file a SQLite URL names (``None``: another database, memory, or a URI)."""
    if url.get_backend_name() != "sqlite" or is_sqlite_memory(url) or url.query.get("uri"):
        return None
    return str(url.database)


def is_sqlite_memory(url: URL) -> bool:
    """True for an in-memory SQLite URL, which needs one shared connection."""
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")
