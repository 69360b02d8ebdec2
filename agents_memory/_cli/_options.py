"""The options every command shares, and how they resolve to one :class:`Target`.

``--url`` and the table names may be given before the command (``agents-memory
--url … sessions list``) or after it (``agents-memory db upgrade --url …``, the
form error messages print); the one after wins, then the environment, then the
embedded default.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Annotated

import typer

from agents_memory._errors import UnsupportedDatabaseError
from agents_memory._tables import (
    DEFAULT_MESSAGES_TABLE,
    DEFAULT_SESSIONS_TABLE,
    MESSAGES_TABLE_ENV,
    SESSIONS_TABLE_ENV,
    TableNames,
    resolve_names,
)
from agents_memory._urls import DEFAULT_URL, URL_ENV, resolve_url

if TYPE_CHECKING:
    from agents_memory._admin._target import Target

PANEL = "Store"

UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        help=f"Database URL; else ${URL_ENV}, else {DEFAULT_URL}.",
        show_default=False,
        rich_help_panel=PANEL,
    ),
]
SessionsTableOption = Annotated[
    str | None,
    typer.Option(
        "--sessions-table",
        metavar="NAME",
        help=f"Sessions table; else ${SESSIONS_TABLE_ENV}, else {DEFAULT_SESSIONS_TABLE}.",
        show_default=False,
        rich_help_panel=PANEL,
    ),
]
MessagesTableOption = Annotated[
    str | None,
    typer.Option(
        "--messages-table",
        metavar="NAME",
        help=f"Messages table; else ${MESSAGES_TABLE_ENV}, else {DEFAULT_MESSAGES_TABLE}.",
        show_default=False,
        rich_help_panel=PANEL,
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
YesOption = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


@dataclasses.dataclass(slots=True)
class Globals:
    """What the options before the command said."""

    url: str | None = None
    sessions_table: str | None = None
    messages_table: str | None = None
    json: bool = False
    debug: bool = False


def globals_of(ctx: typer.Context) -> Globals:
    """The root command's options (defaults when a command runs on its own)."""
    obj = ctx.find_root().obj
    return obj if isinstance(obj, Globals) else Globals()


def raw_url(ctx: typer.Context, url: str | None = None) -> str:
    """The URL in force: this command's, the global one, the environment's, the default."""
    return resolve_url({"url": url or globals_of(ctx).url})


def target(
    ctx: typer.Context,
    url: str | None = None,
    sessions_table: str | None = None,
    messages_table: str | None = None,
) -> Target:
    """Resolve the store a command acts on; a bad URL or table name is a usage error."""
    g = globals_of(ctx)
    given = {
        "sessions_table": sessions_table or g.sessions_table,
        "messages_table": messages_table or g.messages_table,
    }
    try:
        names = resolve_names(given)
    except (TypeError, ValueError) as exc:
        hint = "'--sessions-table' / '--messages-table'"
        raise typer.BadParameter(str(exc), param_hint=hint) from None
    return target_for_url(raw_url(ctx, url), names, option="--url")


def target_for_url(url: str, names: TableNames, *, option: str) -> Target:
    """A target for a URL given on the command line; an unsupported one is a usage error."""
    from agents_memory._admin._target import Target  # noqa: PLC0415 - not for --help

    try:
        return Target(url, names)
    except UnsupportedDatabaseError as exc:
        raise typer.BadParameter(str(exc), param_hint=f"'{option}'") from None


def wants_json(ctx: typer.Context, flag: bool) -> bool:
    """``--json`` after the command, or before it."""
    return flag or globals_of(ctx).json
