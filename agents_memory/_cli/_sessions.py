"""``agents-memory sessions …``: list, show, delete and count (the work is in _admin)."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Annotated

import typer
from rich.table import Table

from agents_memory._admin import _sessions as ops
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
from agents_memory._cli._output import json_text, out, plural, print_json, when
from agents_memory._cli._render import MAX_TEXT, describe, shown_id
from agents_memory._cli._run import run
from agents_memory._sqlalchemy._metadata import FilterValue
from agents_memory._sqlalchemy._store import MAX_PAGE_SIZE, _decode_cursor

app = typer.Typer(
    name="sessions",
    help="List, read, delete and count stored conversations.",
    no_args_is_help=True,
    epilog=(
        "Examples:\n\n"
        "  agents-memory sessions list --limit 10\n\n"
        "  agents-memory sessions show user-42 --limit 20\n\n"
        "  agents-memory sessions stats --json"
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


def _check_cursor(cursor: str | None) -> str | None:
    if cursor is not None:
        try:
            _decode_cursor(cursor)
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
    limit: Annotated[int, typer.Option(min=1, max=MAX_PAGE_SIZE, help="Sessions per page.")] = 20,
    cursor: Annotated[
        str | None,
        typer.Option(help="Continue after a previous page (its cursor).", callback=_check_cursor),
    ] = None,
    metadata: Annotated[
        list[str] | None,
        typer.Option(
            "--metadata",
            "-m",
            help="Only sessions whose metadata has key=value (text) or key:=json; repeatable.",
        ),
    ] = None,
    url: UrlOption = None,
    sessions_table: SessionsTableOption = None,
    messages_table: MessagesTableOption = None,
    json_: JsonOption = False,
) -> None:
    """List sessions, most recently updated first, with item counts and times."""
    where = target(ctx, url, sessions_table, messages_table)
    wanted = _parse_filter(metadata or [])
    page = run(ctx, ops.list_sessions(where, limit=limit, cursor=cursor, metadata=wanted))
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
        int | None, typer.Option(min=0, help="Only the latest N items.", show_default=False)
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
    largest: Annotated[int, typer.Option(min=0, max=100, help="How many largest to list.")] = 5,
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
