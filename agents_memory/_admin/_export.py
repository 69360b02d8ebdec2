"""``agents-memory export`` / ``import``: a store to JSON Lines and back, streaming both ways."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

from agents_memory import migrations
from agents_memory._admin._errors import InvalidFileError
from agents_memory._admin._jsonl import Reader, header_line, item_line, scan
from agents_memory._admin._target import Target, open_store
from agents_memory._admin._transfer import (
    TransferResult,
    named_pages,
    named_states,
    store_pages,
    transfer,
)
from agents_memory._admin._types import IfExists, NoProgress, Progress
from agents_memory._sqlalchemy._bulk import bulk_for


@dataclasses.dataclass(frozen=True, slots=True)
class ExportResult:
    """What an export wrote."""

    sessions: int
    items: int


async def export(
    target: Target,
    out: TextIO,
    *,
    session_ids: Sequence[str] = (),
    batch_size: int = 1000,
    progress: Progress | None = None,
) -> ExportResult:
    """Write the named sessions (default: all, in id order) to ``out`` as JSON Lines.

    Items are read ``batch_size`` rows at a time and written as they come, so
    memory stays bounded whatever the store's size.
    """
    progress = progress or NoProgress()
    sessions = items = 0
    async with open_store(target) as store:
        bulk = bulk_for(store)
        if session_ids:
            states = await named_states(bulk, session_ids, where=str(target))
            total = sum(state.item_count for state in states.values())
            pages = named_pages(bulk, states, batch_size=batch_size)
        else:
            total = (await store.stats(largest=0)).items
            pages = store_pages(bulk, batch_size=batch_size)
        progress.start(total)
        async for page in pages:
            for src in page:
                out.write(header_line(src.record))
                sessions += 1
                lines: list[str] = []
                async for entry in src.items():
                    lines.append(item_line(entry))
                    if len(lines) >= batch_size:
                        out.write("".join(lines))
                        items += len(lines)
                        progress.advance(len(lines))
                        lines = []
                out.write("".join(lines))
                items += len(lines)
                progress.advance(len(lines))
    out.flush()
    return ExportResult(sessions, items)


async def export_file(
    target: Target,
    path: Path,
    *,
    session_ids: Sequence[str] = (),
    batch_size: int = 1000,
    progress: Progress | None = None,
) -> ExportResult:
    """Export to ``path``, which appears only once complete (a failed export leaves no file)."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        with partial.open("w", encoding="utf-8", newline="\n") as out:
            result = await export(
                target, out, session_ids=session_ids, batch_size=batch_size, progress=progress
            )
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return result


@contextlib.contextmanager
def _local_file(source: Path | None) -> Iterator[Path]:
    """The file to import; standard input is spooled first, as the import reads it twice."""
    if source is not None:
        yield source
        return
    fd, name = tempfile.mkstemp(prefix="agents-memory-import-", suffix=".jsonl")
    try:
        with os.fdopen(fd, "wb") as spool:
            shutil.copyfileobj(sys.stdin.buffer, spool)
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


GZIP_MAGIC = b"\x1f\x8b"
"""The first two bytes of every gzip file (``export | gzip > backup.jsonl.gz``)."""


def _gzip_advice(source: Path | None) -> str:
    if source is None:
        return (
            "the input is gzip-compressed; decompress it on the way in: "
            "gunzip -c FILE | agents-memory import -"
        )
    quoted = shlex.quote(str(source))
    return (
        f"{source} is gzip-compressed; decompress it on the way in: "
        f"gunzip -c {quoted} | agents-memory import -"
    )


async def import_file(
    target: Target,
    source: Path | None,
    *,
    batch_size: int = 1000,
    if_exists: IfExists = "resume",
    progress: Progress | None = None,
) -> TransferResult:
    """Read an export (``None``: standard input) into ``target``, migrating it first.

    The whole file is validated before anything is written, so a malformed line
    changes nothing. Then each batch is one transaction, and a re-run after an
    interruption resumes (see :mod:`agents_memory._admin._transfer`).

    With ``target.keyring``, plaintext items are sealed under its current key and
    sealed items are written as they are, once the scan has opened every one of
    them with that keyring (a key it lacks: :class:`~agents_memory.MissingKeyError`
    before anything is written).
    """
    progress = progress or NoProgress()
    with _local_file(source) as path:
        with path.open("rb") as stream:
            if stream.read(2) == GZIP_MAGIC:
                raise InvalidFileError(_gzip_advice(source))
            stream.seek(0)
            totals = scan(stream, target.keyring)
        await migrations.upgrade(target.url, **target.table_kwargs)
        async with open_store(target, must_exist=False) as store:
            progress.start(totals.items)
            with path.open("rb") as stream:
                return await transfer(
                    Reader(stream).pages(),
                    bulk_for(store),
                    batch_size=batch_size,
                    if_exists=if_exists,
                    progress=progress,
                )
