"""``agents-memory sessions …``: list, show, delete and count (the work is in _admin)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
import sys
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from agents_memory._cli import _lazy
from agents_memory._cli._keys import KeysFileOption, with_keys
from agents_memory._cli._options import (
    JsonOption,
    MessagesTableOption,
    SessionsTableOption,
    UrlOption,
    YesOption,
    target,
    wants_json,
)
from agents_memory._cli._output import (
    err,
    json_text,
    out,
    plural,
    print_json,
    progress,
    show_progress,
    when,
)
from agents_memory._cli._render import MAX_TEXT, describe, shown_id
from agents_memory._cli._run import run
from agents_memory._ids import MAX_PAGE_SIZE

if TYPE_CHECKING:
    from agents_memory._admin import _sessions as ops
    from agents_memory._sqlalchemy import _store
    from agents_memory._sqlalchemy._metadata import FilterValue
else:
    ops = _lazy.module("agents_memory._admin._sessions")
    _store = _lazy.module("agents_memory._sqlalchemy._store")

app = typer.Typer(
    name="sessions",
    help="List, read, delete and count stored conversations.",
    no_args_is_help=True,
    epilog=(
        "Examples:\n\n"
        "  agents-memory sessions list --limit 10\n\n"
        "  agents-memory sessions show user-42 --limit 20\n\n"
        "  agents-memory sessions stats --json\n\n"
        "  agents-memory sessions prune --older-than 30d --keep-last 200 --dry-run"
    ),
)

SessionIdArgument = Annotated[str, typer.Argument(help="The session id.", show_default=False)]


def _parse_filter(values: list[str]) -> dict[str, FilterValue]:
    """``key=text`` matches a string; ``key:=json`` a number or boolean (``n:=3``, ``v:=true``)."""
    wanted: dict[str, FilterValue] = {}
    for raw in values:
        key, typed, value = raw.partition(":=")
        if typed and "=" not in key:
            try:
                parsed = json.loads(value)
            except ValueError:
                parsed = None
            if not isinstance(parsed, str | int | float | bool):
                msg = f"{raw!r}: after ':=' give a JSON number, true, false or a quoted string"
                raise typer.BadParameter(msg, param_hint="'--metadata'")
            wanted[key] = parsed
            continue
        key, eq, value = raw.partition("=")
        if not eq or not key:
            msg = f"{raw!r}: use key=value (a string) or key:=json (a number or boolean)"
            raise typer.BadParameter(msg, param_hint="'--metadata'")
        wanted[key] = value
    return wanted


_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_DURATION = re.compile(r"(\d+)([smhdw])")


def _parse_duration(value: str | None) -> dt.timedelta | None:
    """``30d``, ``12h``, ``90m``, ``45s``, ``2w`` (or a sum: ``1d12h``) as a timedelta."""
    if value is None:
        return None
    text = value.strip().lower()
    parts = _DURATION.findall(text)
    if not text or "".join(n + u for n, u in parts) != text:
        msg = f"{value!r}: give a number and a unit, e.g. 30d, 12h, 90m, 45s or 2w"
        raise typer.BadParameter(msg)
    duration = dt.timedelta(0)
    for number, unit in parts:
        duration += dt.timedelta(**{_UNITS[unit]: int(number)})
    if duration <= dt.timedelta(0):
        msg = f"{value!r}: the duration must be longer than zero"
        raise typer.BadParameter(msg)
    return duration


def _check_duration(value: str | None) -> str | None:
    _parse_duration(value)
    return value


OlderThanOption = Annotated[
    str | None,
    typer.Option(
        "--older-than",
        metavar="AGE",
        help="Sessions not written to for this long: 30d, 12h, 90m, 45s, 2w.",
        callback=_check_duration,
        show_default=False,
    ),
]
MetadataOption = Annotated[
    list[str] | None,
    typer.Option(
        "--metadata",
        "-m",
        metavar="KEY=VALUE",
        help="Only sessions whose metadata has key=value (text) or key:=json; repeatable.",
    ),
]


def _check_cursor(cursor: str | None) -> str | None:
    if cursor is not None:
        try:
            _store._decode_cursor(cursor)  # noqa: SLF001 - the store's own cursor format
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    return cursor


@app.command(
    "list",
    epilog=(
        "Examples:\n\n"
        "  agents-memory sessions list\n\n"
        "  agents-memory sessions list --limit 50 --cursor <next_cursor>\n\n"
        "  agents-memory sessions list --metadata user=u42 --metadata priority:=2 --json"
    ),
)
def list_(
    ctx: typer.Context,
    limit: Annotated[
        int, typer.Option(min=1, max=MAX_PAGE_SIZE, metavar="N", help="Sessions per page.")
    ] = 20,
    cursor: Annotated[
        str | None,
        typer.Option(help="Continue after a previous page (its cursor).", callback=_check_cursor),
    ] = None,
    metadata: MetadataOption = None,
    older_than: OlderThanOption = None,
    oldest: Annotated[bool, typer.Option("--oldest", help="Least recently updated first.")] = False,
    url: UrlOption = None,
    sessions_table: SessionsTableOption = None,
    messages_table: MessagesTableOption = None,
    json_: JsonOption = False,
) -> None:
    """List sessions, most recently updated first (or --oldest), with item counts and times."""
    where = target(ctx, url, sessions_table, messages_table)
    wanted = _parse_filter(metadata or [])
    age = _parse_duration(older_than)
    before = None if age is None else dt.datetime.now(dt.UTC).replace(tzinfo=None) - age
    page = run(
        ctx,
        ops.list_sessions(
            where,
            limit=limit,
            cursor=cursor,
            metadata=wanted,
            updated_before=before,
            order="oldest" if oldest else "newest",
        ),
    )
    if wants_json(ctx, json_):
        print_json(
            {
                # no metadata is null, as in an export (one rule for every JSON output)
                "sessions": [
                    {**dataclasses.asdict(i), "metadata": i.metadata or None} for i in page.sessions
                ],
                "next_cursor": page.next_cursor,
            }
        )
        return
    if not page.sessions:
        typer.echo(f"no sessions in {where}" + (" match the filter" if wanted else ""))
        return
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column, justify in (
        ("SESSION", "left"),
        ("ITEMS", "right"),
        ("CREATED", "left"),
        ("UPDATED", "left"),
        ("METADATA", "left"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for info in page.sessions:
        meta = json_text(info.metadata, indent=None) if info.metadata else ""
        times = when(info.created_at), when(info.updated_at)
        table.add_row(shown_id(info.session_id), str(info.item_count), *times, meta)
    console = out()
    with console.capture() as captured:
        console.print(table, markup=False)
    typer.echo("\n".join(line.rstrip() for line in captured.get().splitlines()))
    if page.next_cursor:
        typer.echo(f"more: --cursor {page.next_cursor}")


@app.command(
    epilog=(
        "Examples:\n\n"
        "  agents-memory sessions show user-42\n\n"
        "  agents-memory sessions show user-42 --limit 10\n\n"
        "  agents-memory sessions show user-42 --json > user-42.json"
    )
)
def show(
    ctx: typer.Context,
    session_id: SessionIdArgument,
    limit: Annotated[
        int | None,
        typer.Option(min=0, metavar="N", help="Only the latest N items.", show_default=False),
    ] = None,
    full: Annotated[
        bool,
        typer.Option("--full", help=f"Show each item whole (else cut at {MAX_TEXT} characters)."),
    ] = False,
    keys_file: KeysFileOption = None,
    url: UrlOption = None,
    sessions_table: SessionsTableOption = None,
    messages_table: MessagesTableOption = None,
    json_: JsonOption = False,
) -> None:
    """Print a session as a readable transcript (--json: its raw items, oldest first).

    Encrypted items are opened with the keys of --keys-file or the environment.
    """
    where = with_keys(target(ctx, url, sessions_table, messages_table), keys_file)
    as_json = wants_json(ctx, json_)

    async def show_it() -> None:
        async with ops.transcript(where, session_id, limit=limit) as t:
            if as_json:  # streamed: a JSON array of any length in bounded memory
                sys.stdout.write("[")
                sep = "\n  "
                async for item in t.items:
                    sys.stdout.write(sep + json_text(item, indent=None))
                    sep = ",\n  "
                sys.stdout.write("\n]\n" if sep != "\n  " else "]\n")
                return
            info = t.info
            typer.echo(
                f"session {info.session_id!r}: {plural(info.item_count, 'item')}, "
                f"created {when(info.created_at)}, updated {when(info.updated_at)}"
            )
            if info.metadata:
                typer.echo(f"metadata: {json_text(info.metadata, indent=None)}")
            if limit is not None and limit < info.item_count:
                typer.echo(f"(the latest {limit} of {info.item_count})")
            number = t.first_number
            async for item in t.items:
                typer.echo(f"{number:>4}. {describe(item, limit=None if full else MAX_TEXT)}")
                number += 1

    run(ctx, show_it())


@app.command(
    epilog="Examples:\n\n  agents-memory sessions delete user-42\n\n"
    "  agents-memory sessions delete user-42 --yes"
)
def delete(
    ctx: typer.Context,
    session_id: SessionIdArgument,
    yes: YesOption = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Delete even encrypted items no key given can open (a lost key)."
        ),
    ] = False,
    keys_file: KeysFileOption = None,
    url: UrlOption = None,
    sessions_table: SessionsTableOption = None,
    messages_table: MessagesTableOption = None,
) -> None:
    """Delete a session and all its items (asks first, unless --yes).

    Encrypted items are checked against the keys of --keys-file or the environment
    first; one they cannot open refuses the delete, unless --force.
    """
    where = with_keys(target(ctx, url, sessions_table, messages_table), keys_file)
    if not yes:
        info = run(ctx, ops.get_session(where, session_id))
        items = plural(info.item_count, "item")
        typer.confirm(f"Delete session {session_id!r} and its {items} from {where}?", abort=True)
    deleted = run(ctx, ops.delete_session(where, session_id, force=force))
    typer.echo(
        f"deleted session {session_id!r} ({plural(deleted.item_count, 'item')}) from {where}"
    )


@app.command(
    epilog="Examples:\n\n  agents-memory sessions stats\n\n"
    "  agents-memory sessions stats --largest 10 --json"
)
def stats(
    ctx: typer.Context,
    largest: Annotated[
        int, typer.Option(min=0, max=100, metavar="N", help="How many largest to list.")
    ] = 5,
    url: UrlOption = None,
    sessions_table: SessionsTableOption = None,
    messages_table: MessagesTableOption = None,
    json_: JsonOption = False,
) -> None:
    """Count sessions and items, and name the largest sessions."""
    where = target(ctx, url, sessions_table, messages_table)
    totals = run(ctx, ops.stats(where, largest=largest))
    if wants_json(ctx, json_):
        print_json(
            {
                "sessions": totals.sessions,
                "items": totals.items,
                "oldest_created_at": totals.oldest_created_at,
                "newest_updated_at": totals.newest_updated_at,
                "largest": [
                    {"session_id": s, "item_count": n, "bytes": b}
                    for (s, n), b in zip(totals.largest, totals.largest_bytes, strict=True)
                ],
            }
        )
        return
    typer.echo(f"store          {where}")
    typer.echo(f"sessions       {totals.sessions}")
    typer.echo(f"items          {totals.items}")
    typer.echo(f"first created  {when(totals.oldest_created_at)}")
    typer.echo(f"last updated   {when(totals.newest_updated_at)}")
    if totals.largest:
        typer.echo("largest sessions:")
        width = max(len(shown_id(s)) for s, _ in totals.largest)
        for (sid, n), size in zip(totals.largest, totals.largest_bytes, strict=True):
            typer.echo(f"  {shown_id(sid):<{width}}  {plural(n, 'item')}, {plural(size, 'byte')}")


@app.command(
    epilog=(
        "Examples:\n\n"
        "  agents-memory sessions prune --older-than 30d --dry-run\n\n"
        "  agents-memory sessions prune --older-than 90d --keep-last 500 --yes\n\n"
        "  agents-memory sessions prune --keep-last 100 -m plan=free --yes --json"
    )
)
def prune(
    ctx: typer.Context,
    older_than: OlderThanOption = None,
    keep_last: Annotated[
        int | None,
        typer.Option(
            "--keep-last",
            min=0,
            metavar="N",
            help="Trim every other session to its newest N items.",
        ),
    ] = None,
    metadata: MetadataOption = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Count what would be deleted; delete nothing.")
    ] = False,
    yes: YesOption = False,
    url: UrlOption = None,
    sessions_table: SessionsTableOption = None,
    messages_table: MessagesTableOption = None,
    json_: JsonOption = False,
) -> None:
    """Delete stale and expired sessions and trim long ones (asks first, unless --yes).

    Runs in short batches beside live traffic; safe to stop (Ctrl-C, a kill) and run again.
    """
    where = target(ctx, url, sessions_table, messages_table)
    wanted = _parse_filter(metadata or [])
    age = _parse_duration(older_than)
    as_json = wants_json(ctx, json_)
    if not (yes or dry_run):
        what = []
        if age is not None:
            what.append(f"delete sessions not updated for {older_than}")
        if keep_last is not None:
            what.append(f"trim the others to their newest {plural(keep_last, 'item')}")
        what.append("delete expired sessions")
        scope = " matching the filter" if wanted else ""
        typer.confirm(f"In {where}{scope}: {', '.join(what)}?", abort=True)
    label = "counting" if dry_run else "pruning"
    with progress(label, enabled=show_progress(json_output=as_json)) as bar:
        report = run(
            ctx,
            ops.prune(
                where,
                older_than=age,
                keep_last=keep_last,
                metadata=wanted or None,
                dry_run=dry_run,
                progress=bar,
            ),
        )
    if as_json:
        print_json(dataclasses.asdict(report))
        return
    verb = "would delete" if dry_run else "deleted"
    freed = "" if report.bytes_freed is None else f" ({plural(report.bytes_freed, 'byte')})"
    typer.echo(
        f"{verb} {plural(report.sessions_deleted, 'session')} and "
        f"{plural(report.items_deleted, 'item')}{freed}; "
        f"{'would trim' if dry_run else 'trimmed'} {plural(report.sessions_trimmed, 'session')} "
        f"in {where}"
    )
    if dry_run:
        err().print("dry run: nothing was deleted", markup=False)
