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
from agents_memory._admin._advanced_copy import (
    AdvancedRows,
    Carried,
    advanced_ids,
    cleared_names,
    read_advanced,
)
from agents_memory._admin._errors import InvalidFileError
from agents_memory._admin._jsonl import (
    Reader,
    advanced_lines,
    advanced_records,
    cleared_lines,
    header_line,
    item_line,
    scan,
)
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
from agents_memory._sqlalchemy._store import SessionStore, backend_of


@dataclasses.dataclass(frozen=True, slots=True)
class ExportResult:
    """What an export wrote."""

    sessions: int
    items: int
    advanced_sessions: int = 0
    """Advanced sessions whose turns, usage and branch names were written."""
    advanced_skipped: int = 0
    """Advanced sessions written without them: their items changed while being read, or a
    corrupt one was left out (the positions would not match)."""
    advanced_cleared: int = 0
    """Sessions cleared in the store whose used branch names were written."""


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
    memory stays bounded whatever the store's size. An advanced session's rows
    follow its items (one session's at a time in memory); a whole-store export
    ends with the branch names of sessions cleared in the store (see ``_jsonl``).
    """
    progress = progress or NoProgress()
    sessions = items = 0
    carried = Carried()
    async with open_store(target) as store:
        bulk = bulk_for(store)
        backend = backend_of(store)
        advanced = set(await advanced_ids(backend))
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
                written = 0
                lines: list[str] = []
                async for entry in src.items():
                    lines.append(item_line(entry))
                    if len(lines) >= batch_size:
                        out.write("".join(lines))
                        written += len(lines)
                        progress.advance(len(lines))
                        lines = []
                out.write("".join(lines))
                written += len(lines)
                progress.advance(len(lines))
                items += written
                sid = src.record.session_id
                if sid in advanced:
                    _write_advanced(out, await read_advanced(backend, sid), written, carried)
        if not session_ids:
            async for sid, names in cleared_names(backend):
                out.write(cleared_lines(sid, names))
                carried.cleared += 1
    out.flush()
    return ExportResult(sessions, items, carried.sessions, carried.skipped, carried.cleared)


def _write_advanced(out: TextIO, rows: AdvancedRows, written: int, carried: Carried) -> None:
    """A session's advanced lines, if its rows name the items just written (else counted)."""
    if not rows:
        return
    if rows.items != written:
        carried.skipped += 1
        return
    out.write(advanced_lines(rows))
    carried.sessions += 1


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

    With ``resume`` or ``replace``, the advanced sessions' rows and the cleared
    sessions' names the file holds are then carried as ``copy`` carries them
    (:mod:`agents_memory._admin._advanced_copy`): a session whose target holds
    another number of items than the file is left as it is and counted.
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
                result = await transfer(
                    Reader(stream).pages(),
                    bulk_for(store),
                    batch_size=batch_size,
                    if_exists=if_exists,
                    progress=progress,
                )
            if totals.advanced and if_exists in ("resume", "replace"):
                result.carried(await _carry(path, store))
            return result


async def _carry(path: Path, store: SessionStore) -> Carried:
    """The file's advanced rows and cleared sessions' names, into ``store`` (a third read)."""
    carried = Carried()
    backend = backend_of(store)
    with path.open("rb") as stream:
        for sid, rows in advanced_records(stream):
            if isinstance(rows, AdvancedRows):
                await carried.session(backend, sid, rows)
            else:
                await carried.names(backend, sid, rows)
    return carried
