"""``export``, ``import`` and ``copy``: moving sessions out, in and across (work in _admin)."""

from __future__ import annotations

import dataclasses
import enum
import io
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from agents_memory._admin._types import IF_EXISTS, IfExists
from agents_memory._cli import _lazy
from agents_memory._cli._keys import KeysFileOption, with_keys
from agents_memory._cli._options import (
    JsonOption,
    MessagesTableOption,
    SessionsTableOption,
    UrlOption,
    target,
    target_for_url,
    wants_json,
)
from agents_memory._cli._output import err, plural, print_json, progress, show_progress
from agents_memory._cli._run import run
from agents_memory._tables import TableNames

if TYPE_CHECKING:
    from agents_memory._admin import _copy, _export
    from agents_memory._admin._export import ExportResult
    from agents_memory._admin._transfer import TransferResult
else:
    _copy = _lazy.module("agents_memory._admin._copy")
    _export = _lazy.module("agents_memory._admin._export")

BatchOption = Annotated[
    int,
    typer.Option(
        "--batch", min=1, max=10_000, metavar="N", help="Items per read and per write transaction."
    ),
]


class IfExistsChoice(enum.Enum):
    """The ``--if-exists`` choices (the values of :data:`IfExists`)."""

    resume = "resume"
    skip = "skip"
    replace = "replace"
    append = "append"


assert tuple(c.value for c in IfExistsChoice) == IF_EXISTS  # noqa: S101 - one list

IfExistsOption = Annotated[
    IfExistsChoice,
    typer.Option(
        "--if-exists",
        help=(
            "For a session the target already has. resume: continue it if it holds the start "
            "of the source's items, else stop with an error (a re-run finishes an interrupted "
            "job); skip: keep it; replace: delete its items first; append: add all items "
            "after its own."
        ),
    ),
]


def _summary(verb: str, result: TransferResult, where: str) -> str:
    text = (
        f"{verb} {plural(result.sessions_written, 'session')} "
        f"({plural(result.items_written, 'item')}) {where}"
    )
    if result.sessions_unchanged or result.items_present:
        text += (
            f"; {plural(result.sessions_unchanged, 'session')} and "
            f"{plural(result.items_present, 'item')} were already there"
        )
    return text


def _exported(done: ExportResult) -> str:
    return f"exported {plural(done.sessions, 'session')} ({plural(done.items, 'item')})"


def export(
    ctx: typer.Context,
    session_ids: Annotated[
        list[str] | None,
        typer.Argument(
            help="Sessions to export (default: all).", metavar="SESSION_ID", show_default=False
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            metavar="FILE",
            help="File to write (default: standard output).",
            dir_okay=False,
        ),
    ] = None,
    batch: BatchOption = 1000,
    decrypt: Annotated[
        bool,
        typer.Option(
            "--decrypt",
            help="Write encrypted items as plaintext (keys from --keys-file or the environment).",
        ),
    ] = False,
    keys_file: KeysFileOption = None,
    url: UrlOption = None,
    sessions_table: SessionsTableOption = None,
    messages_table: MessagesTableOption = None,
    json_: JsonOption = False,
) -> None:
    """Write sessions as JSON Lines: a header line per session, then its items with their times.

    A header is {"session", "created_at", "updated_at", "metadata"}, an item
    {"item", "created_at"}; `agents-memory import` reads it back exactly. An
    encrypted item is written as it is stored, {"sealed", "created_at"} (no key
    needed), unless --decrypt. An advanced session's turns, usage and branch names
    follow its items ({"structure"}, {"usage"}, {"branch"} lines), and a whole-store
    export ends with the branch names of cleared sessions ({"cleared_session"}).
    """
    where = target(ctx, url, sessions_table, messages_table)
    if decrypt:
        where = with_keys(where, keys_file, required=True)
    ids = list(session_ids or [])
    as_json = wants_json(ctx, json_)
    if output is None:
        stream = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n")
        on_terminal = show_progress(data_on_stdout=True)
        try:
            with progress("export", enabled=on_terminal) as bar:
                work = _export.export(
                    where, stream, session_ids=ids, batch_size=batch, progress=bar
                )
                done = run(ctx, work)
        finally:
            stream.flush()
            stream.detach()
        if on_terminal:
            err().print(_exported(done), markup=False)
        return
    with progress("export", enabled=show_progress(json_output=as_json)) as bar:
        done = run(
            ctx,
            _export.export_file(where, output, session_ids=ids, batch_size=batch, progress=bar),
        )
    if as_json:
        print_json({**dataclasses.asdict(done), "file": str(output)})
    else:
        typer.echo(f"{_exported(done)} from {where} to {output}")


def import_(
    ctx: typer.Context,
    file: Annotated[
        Path,
        typer.Argument(
            help="An export file, or - for standard input.", dir_okay=False, show_default=False
        ),
    ],
    if_exists: IfExistsOption = IfExistsChoice.resume,
    batch: BatchOption = 1000,
    keys_file: KeysFileOption = None,
    url: UrlOption = None,
    sessions_table: SessionsTableOption = None,
    messages_table: MessagesTableOption = None,
    json_: JsonOption = False,
) -> None:
    """Read an export into the store (migrated first), keeping its times and order.

    The whole file is checked before anything is written. Each batch is one
    transaction; if the import stops half-way, run it again: sessions already
    there are recognised and finished, not duplicated. With keys (--keys-file or
    the environment, as for `keys rotate`) plaintext items are encrypted under the
    current key, and every sealed item must open with those keys.
    """
    where = with_keys(target(ctx, url, sessions_table, messages_table), keys_file)
    source = None if str(file) == "-" else file
    as_json = wants_json(ctx, json_)
    mode: IfExists = if_exists.value
    with progress("import", enabled=show_progress(json_output=as_json)) as bar:
        result = run(
            ctx,
            _export.import_file(where, source, batch_size=batch, if_exists=mode, progress=bar),
        )
    if as_json:
        print_json(dataclasses.asdict(result))
    else:
        typer.echo(_summary("imported", result, f"into {where}"))


def copy(
    ctx: typer.Context,
    to: Annotated[
        str,
        typer.Option(
            "--to", metavar="URL", help="URL of the store to copy into.", show_default=False
        ),
    ],
    from_: Annotated[
        str | None,
        typer.Option(
            "--from",
            metavar="URL",
            help="URL to copy from (default: the --url in force).",
            show_default=False,
        ),
    ] = None,
    if_exists: IfExistsOption = IfExistsChoice.resume,
    batch: BatchOption = 1000,
    to_sessions_table: Annotated[
        str | None,
        typer.Option(
            "--to-sessions-table",
            metavar="NAME",
            help="Sessions table in the target (default: the source's).",
            show_default=False,
        ),
    ] = None,
    to_messages_table: Annotated[
        str | None,
        typer.Option(
            "--to-messages-table",
            metavar="NAME",
            help="Messages table in the target (default: the source's).",
            show_default=False,
        ),
    ] = None,
    url: UrlOption = None,
    sessions_table: SessionsTableOption = None,
    messages_table: MessagesTableOption = None,
    json_: JsonOption = False,
) -> None:
    """Copy every session and item into another store, keeping times and order; resumable.

    The target is migrated first. Items stream across in batches, one
    transaction each, so memory stays bounded. If the copy stops (Ctrl-C, a
    lost connection, a crash), run the same command again: it checks what
    the target already holds and finishes the job without duplicates.
    """
    source = target(ctx, from_ or url, sessions_table, messages_table)
    try:
        dest_names = TableNames(
            to_sessions_table or source.names.sessions, to_messages_table or source.names.messages
        )
    except (TypeError, ValueError) as exc:
        hint = "'--to-sessions-table' / '--to-messages-table'"
        raise typer.BadParameter(str(exc), param_hint=hint) from None
    dest = target_for_url(to, dest_names, option="--to")
    as_json = wants_json(ctx, json_)
    mode: IfExists = if_exists.value
    with progress("copy", enabled=show_progress(json_output=as_json)) as bar:
        result = run(
            ctx,
            _copy.copy(source, dest, batch_size=batch, if_exists=mode, progress=bar),
            urls=[source.url, dest.url],
        )
    if as_json:
        print_json(dataclasses.asdict(result))
    else:
        typer.echo(_summary("copied", result, f"from {source} to {dest}"))
