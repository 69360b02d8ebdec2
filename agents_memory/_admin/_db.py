"""``agents-memory db …``: the migrations API for one target, with before/after revisions."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable

from alembic.util.exc import CommandError

from agents_memory import migrations
from agents_memory._admin._errors import AdminError
from agents_memory._admin._target import Target, require_database
from agents_memory._migrations._layout import resolve_layout
from agents_memory._migrations._lock import resolve_mode


@dataclasses.dataclass(frozen=True, slots=True)
class Migration:
    """What a migration command did: the revision before and after (``None``: no schema)."""

    before: str | None
    after: str | None


def _unknown_revision(revision: str, exc: CommandError) -> AdminError:
    known = ", ".join(r.revision for r in migrations.history())
    msg = (
        f"cannot migrate to revision {revision!r} ({exc}); use one of {known}, head or base "
        "(see `agents-memory db history`)"
    )
    return AdminError(msg)


async def _migrate(
    target: Target,
    step: Callable[..., Awaitable[None]],
    revision: str,
    lock: str | None,
    **options: object,
) -> Migration:
    """Run ``step`` (``migrations.upgrade`` or ``downgrade``) with the revisions around it."""
    before = await migrations.current(target.url, **target.table_kwargs)
    try:
        await step(target.url, revision=revision, lock=lock, **options, **target.table_kwargs)
    except CommandError as exc:
        raise _unknown_revision(revision, exc) from exc
    return Migration(before, await migrations.current(target.url, **target.table_kwargs))


async def upgrade(
    target: Target,
    *,
    revision: str = "head",
    lock: str | None = None,
    partitions: int | None = None,
) -> Migration:
    """Upgrade ``target`` to ``revision``, creating the tables (and a SQLite file) if needed.

    ``lock``: ``auto``, ``advisory`` or ``row`` (see ``migrations.upgrade``);
    ``None``: ``$AGENTS_MEMORY_MIGRATION_LOCK``, else ``auto``. ``partitions``: the
    Postgres hash-partitioned layout (see ``migrations.upgrade``).
    """
    resolve_mode(lock)  # a bad choice fails before a connection (or a SQLite file) is made
    resolve_layout(partitions)
    return await _migrate(target, migrations.upgrade, revision, lock, partitions=partitions)


async def downgrade(target: Target, *, revision: str, lock: str | None = None) -> Migration:
    """Step ``target`` back to ``revision``; ``base`` drops the tables and all their data."""
    resolve_mode(lock)
    require_database(target)
    return await _migrate(target, migrations.downgrade, revision, lock)


async def current(target: Target) -> str | None:
    """The revision ``target`` is at (``None``: never migrated)."""
    require_database(target)
    return await migrations.current(target.url, **target.table_kwargs)


async def check(target: Target) -> list[str]:
    """Differences between ``target`` and this version's models; empty means up to date."""
    require_database(target)
    return await migrations.check(target.url, **target.table_kwargs)


def history() -> list[migrations.Revision]:
    """Every revision this version knows, oldest first (no database needed)."""
    return migrations.history()
