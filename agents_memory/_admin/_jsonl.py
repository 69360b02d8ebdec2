"""The export format: JSON Lines, each session's header line followed by its items, oldest first.

::

    {"session":"user-1","created_at":"2025-05-01T09:30:00","updated_at":"2025-05-01T09:31:12.5","metadata":{"user":"u1"}}
    {"item":{"role":"user","content":"hi"},"created_at":"2025-05-01T09:30:00"}

Every line is an object with exactly those keys, so a header is never mistaken
for an item, whatever keys items have. Times are ISO 8601 as stored (naive,
UTC by the store's convention); a time with an offset is converted to UTC on
import. Text is UTF-8 with non-ASCII characters as they are, and items are
encoded by the library's one JSON rule, so a round trip is exact.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any, BinaryIO

from agents_memory._admin._errors import InvalidFileError
from agents_memory._admin._transfer import SourceSession
from agents_memory._codec import decode_json as _decode
from agents_memory._codec import encode_item
from agents_memory._crypto import Keyring, is_envelope
from agents_memory._sqlalchemy._bulk import ItemRecord, SessionRecord

_HEADER_KEYS = frozenset({"session", "created_at", "updated_at", "metadata"})
_DEADLINE_KEYS = _HEADER_KEYS | {"expires_at"}
"""A header of a session with a deadline (files written before it had none still import)."""
_ITEM_KEYS = frozenset({"item", "created_at"})
_SEALED_KEYS = frozenset({"sealed", "created_at"})
"""An encrypted item exported without its key: the stored envelope, imported unchanged."""


def header_line(record: SessionRecord) -> str:
    """The line that opens a session."""
    header: dict[str, Any] = {
        "session": record.session_id,
        "created_at": record.created_at.isoformat(),
        "updated_at": record.updated_at.isoformat(),
        "metadata": record.metadata or None,  # none set: null, as everywhere
    }
    if record.expires_at is not None:  # only then: a file without deadlines reads as before
        header["expires_at"] = record.expires_at.isoformat()
    return encode_item(header) + "\n"


def item_line(entry: ItemRecord) -> str:
    """The line of one item (``{"sealed": …}`` for an encrypted one exported without its key)."""
    when = entry.created_at.isoformat()
    if entry.sealed is not None:
        return encode_item({"sealed": entry.sealed, "created_at": when}) + "\n"
    return encode_item({"item": entry.item, "created_at": when}) + "\n"


def _time(value: object, key: str) -> dt.datetime:
    if not isinstance(value, str):
        msg = f'"{key}" must be an ISO 8601 time string, got {type(value).__name__}'
        raise TypeError(msg)
    try:
        return dt.datetime.fromisoformat(value)
    except ValueError:
        msg = f'"{key}" is not an ISO 8601 time: {value!r}'
        raise ValueError(msg) from None


def _parse(value: object) -> SessionRecord | ItemRecord:
    if not isinstance(value, dict):
        msg = f"expected a JSON object, got {type(value).__name__}"
        raise TypeError(msg)
    keys = frozenset(value)
    if keys in (_HEADER_KEYS, _DEADLINE_KEYS):
        metadata = value["metadata"]
        if metadata is not None and not isinstance(metadata, dict):
            msg = f'"metadata" must be an object or null, got {type(metadata).__name__}'
            raise TypeError(msg)
        return SessionRecord(
            value["session"],
            _time(value["created_at"], "created_at"),
            _time(value["updated_at"], "updated_at"),
            metadata,
            None if value.get("expires_at") is None else _time(value["expires_at"], "expires_at"),
        ).validated()
    if keys == _ITEM_KEYS:
        item = value["item"]
        encode_item(item)  # the one JSON rule: a dict that round-trips exactly
        return ItemRecord(item, _time(value["created_at"], "created_at"))
    if keys == _SEALED_KEYS:
        sealed = value["sealed"]
        if not is_envelope(sealed):
            msg = '"sealed" must be an encrypted item as agents-memory stores it ("am1:…")'
            raise ValueError(msg)
        return ItemRecord({}, _time(value["created_at"], "created_at"), sealed=sealed)
    msg = (
        'expected a session header {"session", "created_at", "updated_at", "metadata"} '
        f'or an item {{"item", "created_at"}}, got keys {sorted(keys)}'
    )
    raise ValueError(msg)


def parse_line(text: str, lineno: int) -> SessionRecord | ItemRecord:
    """Parse and validate one line; :class:`InvalidFileError` names the line and the problem."""
    try:
        try:
            value = _decode(text)
        except json.JSONDecodeError as exc:
            msg = f"not valid JSON ({exc.msg} at column {exc.colno})"
            raise ValueError(msg) from None
        return _parse(value)
    except (TypeError, ValueError) as exc:
        msg = f"line {lineno}: {exc}; fix the file (`agents-memory export --help` has the format)"
        raise InvalidFileError(msg) from None


def _records(stream: BinaryIO) -> Iterator[tuple[int, SessionRecord | ItemRecord]]:
    """Each non-blank line parsed; bytes are decoded line by line, so errors name their line."""
    for lineno, raw in enumerate(stream, 1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            msg = f"line {lineno}: the file is not UTF-8 text ({exc.reason} at byte {exc.start})"
            raise InvalidFileError(msg) from None
        if text.strip():
            yield lineno, parse_line(text, lineno)


@dataclasses.dataclass(frozen=True, slots=True)
class Scan:
    """What a valid file holds."""

    sessions: int
    items: int


def scan(stream: BinaryIO, keyring: Keyring | None = None) -> Scan:
    """Validate a whole file before anything is written; return its totals.

    With ``keyring`` (an encrypting import) every sealed item must open with it:
    one under a key id it lacks is a :class:`~agents_memory.MissingKeyError`, a
    wrong key or an altered item a :class:`~agents_memory.DecryptionError`, naming
    the line and the key id, before anything is written. Otherwise the store would
    hold rows its own keyring cannot read (nor clear, pop or prune).
    """
    sessions = items = 0
    first: dict[str, int] = {}
    for lineno, record in _records(stream):
        if keyring is not None and isinstance(record, ItemRecord) and record.sealed is not None:
            keyring.decrypt(record.sealed, row_id=f"on line {lineno}", cache=False)
        if isinstance(record, SessionRecord):
            sid = record.session_id
            if sid in first:
                msg = f"line {lineno}: session {sid!r} already began on line {first[sid]}"
                raise InvalidFileError(msg + "; give each session one header")
            first[sid] = lineno
            sessions += 1
        elif not sessions:
            msg = f'line {lineno}: an item comes before any session header ({{"session": …}})'
            raise InvalidFileError(msg)
        else:
            items += 1
    return Scan(sessions, items)


class Reader:
    """Stream a (scanned) file as :func:`~agents_memory._admin._transfer.transfer` pages.

    Each page is one session; its items are read on demand, and any the writer
    did not read are skipped before the next header.
    """

    def __init__(self, stream: BinaryIO) -> None:
        self._records = _records(stream)
        self._header: SessionRecord | None = None
        self._in_session = False

    def _next(self) -> SessionRecord | ItemRecord | None:
        entry = next(self._records, None)
        return None if entry is None else entry[1]

    async def _items(self) -> AsyncIterator[ItemRecord]:
        while self._in_session:
            record = self._next()
            if not isinstance(record, ItemRecord):
                self._header, self._in_session = record, False
                return
            yield record

    async def pages(self) -> AsyncIterator[list[SourceSession]]:
        """One page per session, in file order."""
        record = self._next()
        while record is not None:
            if not isinstance(record, SessionRecord):
                msg = "the file changed while it was being imported; run the import again"
                raise InvalidFileError(msg)
            self._in_session = True
            yield [SourceSession(record, None, None, self._items)]
            async for _ in self._items():  # items the writer did not read
                pass
            record = self._header
            self._header = None
