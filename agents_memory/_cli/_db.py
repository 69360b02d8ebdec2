"""``agents-memory db …``: the migrations front end (the work is in agents_memory._admin._db)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from agents_memory._cli import _lazy
from agents_memory._cli._options import (
    JsonOption,
    MessagesTableOption,
    SessionsTableOption,
    UrlOption,
    YesOption,
    target,
    wants_json,
)
from agents_memory._cli._output import print_json
from agents_memory._cli._run import EXIT_ERROR, run

if TYPE_CHECKING:
    from agents_memory import migrations
    from agents_memory._admin import _db as ops
else:
    migrations = _lazy.module("agents_memory.migrations")
    ops = _lazy.module("agents_memory._admin._db")

app = typer.Typer(
    name="db",
    help="Create, upgrade, inspect and downgrade the schema (Alembic migrations).",
    no_args_is_help=True,
    epilog=(
        "Examples:\n\n"
        "  agents-memory db upgrade --url postgresql://app@db/agents\n\n"
        "  agents-memory db check --url sqlite:///memory.db\n\n"
        "  agents-memory db current --json"
    ),
)


LOCK_CHOICES = ("auto", "advisory", "row")
LOCK_ENV = "AGENTS_MEMORY_MIGRATION_LOCK"
"""As agents_memory._migrations._lock says (not imported: --help loads no SQLAlchemy)."""

LockOption = Annotated[
    str | None,
    typer.Option(
        "--lock",
        metavar="auto|advisory|row",
        help=(
            "How migrators exclude each other: the server's advisory lock, a row of "
            "<sessions>_migration_lock (for servers and poolers without working advisory "
            f"locks), or auto (probe, row where advisory fails); else ${LOCK_ENV}, else auto."
        ),
        show_default=False,
    ),
]


PARTITIONS_ENV = "AGENTS_MEMORY_PARTITIONS"
"""As agents_memory._migrations._layout says (not imported: --help loads no SQLAlchemy)."""

PartitionsOption = Annotated[
    int | None,
    typer.Option(
        "--partitions",
        metavar="N",
        min=0,
        max=1024,
        help=(
            "Postgres: build the messages table hash-partitioned by session id into N "
            "partitions (2-1024) when revision 0006 builds it; 0: plain. Else "
            f"${PARTITIONS_ENV}, else plain. A database past 0006 keeps its layout."
        ),
        show_default=False,
    ),
]


def _lock(lock: str | None) -> str | None:
    """A ``--lock`` outside the choices is a usage error (the environment's is checked later)."""
    if lock is not None and lock not in LOCK_CHOICES:
        msg = f"invalid migration lock {lock!r}: use one of {', '.join(LOCK_CHOICES)}"
        raise typer.BadParameter(msg, param_hint="'--lock'")
    return lock


def _rev(revision: str | None) -> str:
    if revision is None:
        return "none"
    return f"{revision} (head)" if revision == migrations.head() else revision


def _migration_json(done: ops.Migration) -> dict[str, str | None]:
    return {"from": done.before, "to": done.after, "head": migrations.head()}


@app.command(
    epilog="Examples:\n\n  agents-memory db upgrade\n\n"
    "  agents-memory db upgrade --url postgresql://app@db/agents --sessions-table chat_sessions "
    "--messages-table chat_messages"
)
def upgrade(
    ctx: typer.Context,
    revision: Annotated[str, typer.Argument(help="Revision to reach.")] = "head",
    url: UrlOption = None,
    sessions_table: SessionsTableOption = None,
    messages_table: MessagesTableOption = None,
    lock: LockOption = None,
    partitions: PartitionsOption = None,
    json_: JsonOption = False,
) -> None:
    """Create the tables, or bring them up to the newest revision (safe to repeat)."""
    where = target(ctx, url, sessions_table, messages_table)
    done = run(ctx, ops.upgrade(where, revision=revision, lock=_lock(lock), partitions=partitions))
    if wants_json(ctx, json_):
        print_json(_migration_json(done))
    elif done.before == done.after:
        typer.echo(f"{where} is already at {_rev(done.after)}; nothing to do")
    else:
        typer.echo(f"upgraded {where} from {_rev(done.before)} to {_rev(done.after)}")


@app.command(
    epilog="Examples:\n\n  agents-memory db downgrade 0001\n\n"
    "  agents-memory db downgrade base --yes"
)
def downgrade(
    ctx: typer.Context,
    revision: Annotated[str, typer.Argument(help="Revision to go back to; 'base' drops all.")],
    yes: YesOption = False,
    url: UrlOption = None,
    sessions_table: SessionsTableOption = None,
    messages_table: MessagesTableOption = None,
    lock: LockOption = None,
    json_: JsonOption = False,
) -> None:
    """Step the schema back to REVISION; this can drop columns or tables and their data."""
    where = target(ctx, url, sessions_table, messages_table)
    lock = _lock(lock)
    if not yes:
        what = "drops the tables and every session" if revision == "base" else "may drop data"
        typer.confirm(f"Downgrade {where} to {revision}? This {what}.", abort=True)
    done = run(ctx, ops.downgrade(where, revision=revision, lock=lock))
    if wants_json(ctx, json_):
        print_json(_migration_json(done))
    else:
        typer.echo(f"downgraded {where} from {_rev(done.before)} to {_rev(done.after)}")


@app.command(epilog="Examples:\n\n  agents-memory db current\n\n  agents-memory db current --json")
def current(
    ctx: typer.Context,
    url: UrlOption = None,
    sessions_table: SessionsTableOption = None,
    messages_table: MessagesTableOption = None,
    json_: JsonOption = False,
) -> None:
    """Print the revision the database is at ('none' if it was never migrated)."""
    where = target(ctx, url, sessions_table, messages_table)
    revision = run(ctx, ops.current(where))
    head = migrations.head()
    if wants_json(ctx, json_):
        print_json({"revision": revision, "head": head, "at_head": revision == head})
    else:
        typer.echo(_rev(revision))


@app.command(
    epilog="Exit status: 0 when up to date, 1 on any difference.\n\n"
    "Examples:\n\n  agents-memory db check --url postgresql://app@db/agents\n\n"
    "  agents-memory db check --json"
)
def check(
    ctx: typer.Context,
    url: UrlOption = None,
    sessions_table: SessionsTableOption = None,
    messages_table: MessagesTableOption = None,
    json_: JsonOption = False,
) -> None:
    """Compare the database with this version's schema; exit 1 and list the differences."""
    where = target(ctx, url, sessions_table, messages_table)
    differences = run(ctx, ops.check(where))
    if wants_json(ctx, json_):
        print_json({"ok": not differences, "differences": differences})
    elif not differences:
        typer.echo(f"{where} is at {_rev(migrations.head())} and matches the models")
    else:
        typer.echo(f"{where} differs from this version's schema:")
        for difference in differences:
            typer.echo(f"  - {difference}")
        typer.echo("run `agents-memory db upgrade` with the same options to fix it")
    if differences:
        raise typer.Exit(EXIT_ERROR)


@app.command(epilog="Examples:\n\n  agents-memory db history\n\n  agents-memory db history --json")
def history(ctx: typer.Context, json_: JsonOption = False) -> None:
    """List the revisions this version knows, oldest first (no database needed)."""
    revisions = ops.history()
    head = migrations.head()
    if wants_json(ctx, json_):
        print_json(
            [
                {
                    "revision": r.revision,
                    "down_revision": r.down_revision,
                    "message": r.message,
                    "head": r.revision == head,
                }
                for r in revisions
            ]
        )
        return
    for r in revisions:
        typer.echo(f"{r.revision}  {r.message}{'  (head)' if r.revision == head else ''}")
