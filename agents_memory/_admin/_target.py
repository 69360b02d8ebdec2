"""Which store an operation acts on (a URL and a table-name set), and opening it."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TypedDict

from agents_memory._admin._errors import NotFoundError
from agents_memory._crypto import Keyring
from agents_memory._sqlalchemy._schema import upgrade_command
from agents_memory._sqlalchemy._store import SessionStore
from agents_memory._tables import TableNames
from agents_memory._urls import is_sqlite_memory, mask_url, normalize_url


class TableKwargs(TypedDict):
    """The table names as keyword arguments (typed, so ``**`` leaves other parameters alone)."""

    sessions_table: str
    messages_table: str


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """A store: one database URL and one table-name set in it."""

    url: str
    names: TableNames = dataclasses.field(default_factory=TableNames)
    keyring: Keyring | None = dataclasses.field(default=None, compare=False, repr=False)
    """Opens (and writes) encrypted items; ``None``: encrypted rows are carried sealed."""

    def __post_init__(self) -> None:
        normalize_url(self.url)  # an unsupported URL fails here, before any connection

    @property
    def table_kwargs(self) -> TableKwargs:
        """The table names as the keyword arguments of the library's functions."""
        return {"sessions_table": self.names.sessions, "messages_table": self.names.messages}

    def __str__(self) -> str:
        """How messages name the store: tables and masked URL, never a password."""
        return f"{self.names.sessions}/{self.names.messages} in {mask_url(self.url)}"

    def sqlite_file(self) -> Path | None:
        """The database file of a SQLite URL (``None`` for other databases or in-memory)."""
        url = normalize_url(self.url)
        if url.get_backend_name() != "sqlite" or is_sqlite_memory(url) or url.query.get("uri"):
            return None
        return Path(str(url.database))

    def same_store_as(self, other: Target) -> bool:
        """True when both name the same tables in the same database."""
        if self.names != other.names:
            return False
        mine, theirs = self.sqlite_file(), other.sqlite_file()
        if mine is not None and theirs is not None:
            return mine.resolve() == theirs.resolve()
        return normalize_url(self.url) == normalize_url(other.url)


def require_database(target: Target) -> None:
    """Refuse to create an empty SQLite file as a side effect of a read."""
    path = target.sqlite_file()
    if path is not None and not path.exists():
        command = upgrade_command(normalize_url(target.url), target.names)
        msg = (
            f"there is no database file at {path} ({mask_url(target.url)}); "
            f"check --url, or create the store with `{command}`"
        )
        raise NotFoundError(msg)


@contextlib.asynccontextmanager
async def open_store(target: Target, *, must_exist: bool = True) -> AsyncIterator[SessionStore]:
    """A store on ``target`` for the duration of one operation (its engine is disposed after)."""
    if must_exist:
        require_database(target)
    names = target.names  # (spelled out: **table_kwargs would also match engine_kwargs for mypy)
    store = SessionStore.from_url(
        target.url,
        sessions_table=names.sessions,
        messages_table=names.messages,
        encryption=target.keyring,
    )
    try:
        yield store
    finally:
        await store.close()
