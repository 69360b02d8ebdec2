"""``agents-memory keys …``: encryption key rotation (keys from the environment or a file)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from agents_memory._admin._keys import (
    CURRENT_ENV,
    KEYS_ENV,
    KEYS_FILE_ENV,
    load_keyring,
    require_keyring,
)
from agents_memory._cli import _lazy
from agents_memory._cli._options import (
    JsonOption,
    MessagesTableOption,
    SessionsTableOption,
    UrlOption,
    target,
    wants_json,
)
from agents_memory._cli._output import plural, print_json, progress, show_progress
from agents_memory._cli._run import fail, run

if TYPE_CHECKING:
    from agents_memory._admin import _rotate
    from agents_memory._admin._target import Target
else:
    _rotate = _lazy.module("agents_memory._admin._rotate")

KEYS_HELP = (
    f"Keys come from ${KEYS_FILE_ENV} or --keys-file (one id=key per line), else ${KEYS_ENV} "
    f"(id=key,id=key); ${CURRENT_ENV} names the current one. Never on the command line."
)

KeysFileOption = Annotated[
    Path | None,
    typer.Option(
        "--keys-file",
        metavar="FILE",
        help=f"File of encryption keys, one id=key per line (else ${KEYS_FILE_ENV} / ${KEYS_ENV}).",
        dir_okay=False,
        show_default=False,
    ),
]


def with_keys(where: Target, keys_file: Path | None, *, required: bool = False) -> Target:
    """``where`` with the keyring of ``keys_file`` or the environment (a bad source: exit 1)."""
    try:
        keyring = require_keyring(keys_file) if required else load_keyring(keys_file)
    except ValueError as exc:
        fail(str(exc))
    return dataclasses.replace(where, keyring=keyring)


app = typer.Typer(
    name="keys",
    help="Encryption at rest: re-encrypt stored items under a new key. " + KEYS_HELP,
    no_args_is_help=True,
    epilog=(
        "Examples:\n\n"
        "  AGENTS_MEMORY_KEYS_FILE=/run/secrets/keys agents-memory keys rotate --to 2026-12 "
        "--dry-run\n\n"
        "  agents-memory keys rotate --to 2026-12 --keys-file /run/secrets/keys --json"
    ),
)


@app.command(
    epilog=(
        "Examples:\n\n"
        "  AGENTS_MEMORY_KEYS_FILE=/run/secrets/am-keys agents-memory keys rotate --to 2026-12\n\n"
        "  agents-memory keys rotate --to 2026-12 --dry-run --keys-file keys.txt"
    )
)
def rotate(
    ctx: typer.Context,
    to: Annotated[
        str,
        typer.Option(
            "--to",
            metavar="KEY_ID",
            help="Key id to re-encrypt every item under.",
            show_default=False,
        ),
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only count the items not yet under that key.")
    ] = False,
    batch_size: Annotated[
        int,
        typer.Option(
            "--batch-size",
            min=1,
            max=10_000,
            metavar="N",
            help="Items per read and per transaction.",
        ),
    ] = 500,
    keys_file: KeysFileOption = None,
    url: UrlOption = None,
    sessions_table: SessionsTableOption = None,
    messages_table: MessagesTableOption = None,
    json_: JsonOption = False,
) -> None:
    """Re-encrypt every item not under key --to (plaintext items too), in short batches.

    Safe while the application keeps writing; if it stops, run it again: it
    continues with what is left. Old keys can be dropped once --dry-run says 0.
    """
    where = with_keys(target(ctx, url, sessions_table, messages_table), keys_file, required=True)
    as_json = wants_json(ctx, json_)
    with progress("rotate", enabled=show_progress(json_output=as_json) and not dry_run) as bar:
        report = run(
            ctx,
            _rotate.rotate_keys(where, to, batch_size=batch_size, dry_run=dry_run, progress=bar),
        )
    if as_json:
        print_json(dataclasses.asdict(report))
    elif dry_run:
        typer.echo(f"{plural(report.remaining, 'item')} in {where} not under key {to!r}")
    else:
        text = f"re-encrypted {plural(report.rotated, 'item')} under key {to!r} in {where}"
        if report.changed:
            text += f"; {plural(report.changed, 'item')} changed meanwhile and were left as written"
        if report.remaining:
            text += (
                f"; {plural(report.remaining, 'item')} still not under it "
                "(written meanwhile under another key, or not text): run it again"
            )
        typer.echo(text)
