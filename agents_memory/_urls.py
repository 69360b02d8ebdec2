"""The one place where database URLs are normalised to an async driver and masked for display."""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from agents_memory._errors import UnsupportedDatabaseError

DEFAULT_URL = "sqlite+aiosqlite:///./agents_memory.db"
"""The embedded default: a SQLite file in the working directory."""

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
    """Talk utf8mb4 unless told otherwise: MySQL's ``utf8`` cannot hold 4-byte characters."""
    if "charset" in url.query:
        return url
    return url.update_query_dict({"charset": "utf8mb4"})


def normalize_url(url: str | URL) -> URL:
    """Map a plain or async URL onto the async driver we support; reject anything else.

    ``sqlite:///x.db`` becomes ``sqlite+aiosqlite:///x.db``, ``postgres://``
    or ``postgresql://`` become ``postgresql+asyncpg://`` and ``mysql://`` /
    ``mariadb://`` (or ``mysql+aiomysql://``) become ``mysql+asyncmy://`` /
    ``mariadb+asyncmy://`` with ``charset=utf8mb4``, so users can paste the URL
    their platform gives them.
    """
    try:
        parsed = make_url(url) if isinstance(url, str) else url
    except (ArgumentError, ValueError):
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


def mask_url(url: str | URL) -> str:
    """Render a URL with its password hidden, for errors, logs and reprs."""
    if isinstance(url, URL):
        return url.render_as_string(hide_password=True)
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        # Not parseable: show only the scheme, never the rest (it may hold a secret).
        scheme, sep, _ = url.partition("://")
        return f"{scheme}{sep}***" if sep else "***"


def is_sqlite_memory(url: URL) -> bool:
    """True for an in-memory SQLite URL, which needs one shared connection."""
    return url.get_backend_name() == "sqlite" and url.database in (None, "", ":memory:")
