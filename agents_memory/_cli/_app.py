"""The typer application: global options, the command tree, and the demo."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from typer.core import TyperArgument, TyperGroup, TyperOption

import agents_memory
from agents_memory._cli import _db, _keys, _sessions, _transfer
from agents_memory._cli._demo import run_demo
from agents_memory._cli._options import (
    Globals,
    JsonOption,
    MessagesTableOption,
    SessionsTableOption,
    UrlOption,
    target,
)
from agents_memory._cli._run import run

_VALUED_GLOBALS = frozenset({"--url", "--sessions-table", "--messages-table"})
_FLAG_GLOBALS = frozenset({"--debug"})


def hoist_globals(args: list[str]) -> list[str]:
    """Move the global options, wherever they were typed, in front of the command name.

    The README promises ``--url``, ``--sessions-table``, ``--messages-table`` and
    ``--debug`` before or after the command; commands that do not declare them
    (``demo``, ``db history``) would otherwise answer "No such option". Moved in
    order, so a later ``--url`` still wins. ``--`` ends the options.
    """
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest += args[i:]
            break
        name = arg.split("=", 1)[0]
        if name in _VALUED_GLOBALS and "=" in arg:
            front.append(arg)
        elif arg in _VALUED_GLOBALS and i + 1 < len(args):
            front += [arg, args[i + 1]]
            i += 1
        elif arg in _FLAG_GLOBALS:
            front.append(arg)
        else:
            rest.append(arg)
        i += 1
    return front + rest


def _no_type(ctx: Any) -> None:  # noqa: ANN401, ARG001 - typer's click context
    return None


def tidy_help(command: Any, ctx: Any) -> None:  # noqa: ANN401 - typer's click objects
    """Make every command's help read as a person would write it.

    Typer labels each option with its Python type (``--json <bool>``, ``--url
    <str>``, ``--metadata <list[str]>``) and each argument with its parameter
    name. Here a flag shows no value (it takes none), and an option or argument
    without a metavar of its own gets its name in capitals (``--limit LIMIT``,
    ``{SESSION_ID}``), the convention of ``man`` pages. Walks the whole tree, the
    help options included, through click's public ``params``/``commands``/
    ``get_help_option``.
    """
    params = list(command.params)
    help_option = command.get_help_option(ctx)
    if help_option is not None:
        params.append(help_option)
    for param in params:
        if isinstance(param, TyperOption) and param.is_flag:
            param.metavar = ""
        elif isinstance(param, TyperOption | TyperArgument):
            if param.metavar is None and not param.type_descriptor.is_choice and param.name:
                param.metavar = param.name.rstrip("_").upper()
            if isinstance(param, TyperArgument):
                # its name column already reads SESSION_ID / FILE: no "<list[str]>" beside it
                param.display_type_rich = _no_type  # type: ignore[method-assign]
    for sub in getattr(command, "commands", {}).values():
        tidy_help(sub, ctx)


class _GlobalsAnywhere(TyperGroup):
    """The root group: global options are accepted after the command name too."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # noqa: ANN401 - typer._click.Context
        """Parse with the global options moved before the command (see :func:`hoist_globals`)."""
        tidy_help(self, ctx)
        return super().parse_args(ctx, hoist_globals(args))


app = typer.Typer(
    cls=_GlobalsAnywhere,
    name="agents-memory",
    help="Operate an agents_memory store: conversation history for AI agents in SQL.",
    epilog=(
        "Examples:\n\n"
        "  agents-memory demo\n\n"
        "  agents-memory --url postgresql://app@db/agents db upgrade\n\n"
        "  agents-memory sessions list --limit 10\n\n"
        "  agents-memory export -o backup.jsonl\n\n"
        "  agents-memory copy --from sqlite:///agents_memory.db --to postgresql://app@db/agents"
    ),
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,  # --debug prints a plain traceback, never local variables
)
app.add_typer(_db.app)
app.add_typer(_sessions.app)
app.add_typer(_keys.app)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"agents-memory {agents_memory.__version__}")
        raise typer.Exit


@app.callback()
def _root(
    ctx: typer.Context,
    url: UrlOption = None,
    sessions_table: SessionsTableOption = None,
    messages_table: MessagesTableOption = None,
    json_: JsonOption = False,
    debug: Annotated[
        bool, typer.Option("--debug", help="Show the traceback when something fails.")
    ] = False,
    version: Annotated[  # noqa: ARG001 - handled eagerly by its callback
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    ctx.obj = Globals(url, sessions_table, messages_table, json_, debug)


@app.command(
    epilog="Examples:\n\n  agents-memory demo\n\n  agents-memory --url sqlite:///try.db demo"
)
def demo(ctx: typer.Context) -> None:
    """Store a short multi-turn agent conversation (with a tool call) and print it back."""
    run(ctx, run_demo(target(ctx)))


app.command(
    epilog=(
        "Examples:\n\n"
        "  agents-memory export -o backup.jsonl\n\n"
        "  agents-memory export user-42 user-43 > two.jsonl\n\n"
        "  agents-memory --url postgresql://app@db/agents export | gzip > backup.jsonl.gz"
    )
)(_transfer.export)
app.command(
    "import",
    epilog=(
        "Examples:\n\n"
        "  agents-memory import backup.jsonl\n\n"
        "  gunzip -c backup.jsonl.gz | agents-memory --url postgresql://app@db/agents import -\n\n"
        "  agents-memory import backup.jsonl --if-exists replace"
    ),
)(_transfer.import_)
app.command(
    epilog=(
        "Examples:\n\n"
        "  agents-memory copy --from sqlite:///agents_memory.db "
        "--to postgresql://app:secret@db/agents\n\n"
        "  agents-memory copy --to postgresql://app@db/agents --batch 5000"
    )
)(_transfer.copy)
