"""The export format: JSON Lines, each session's header line followed by its items, oldest first.

::

    {"session":"user-1","created_at":"2025-05-01T09:30:00","updated_at":"2025-05-01T09:31:12.5","metadata":{"user":"u1"}}
    {"item":{"role":"user","content":"hi"},"created_at":"2025-05-01T09:30:00"}

Every line is an object with exactly those keys, so a header is never mistaken
for an item, whatever keys items have. Times are ISO 8601 as stored (naive,
UTC by the store's convention); a time with an offset is converted to UTC on
import. Text is UTF-8 with non-ASCII characters as they are, and items are
encoded by the library's one JSON rule, so a round trip is exact.

An advanced session's rows follow its items (files without them, and files
written before they existed, import as before)::

    {"structure":{"item":1,"branch_id":"main","message_type":"user","sequence_number":1,"user_turn_number":1,"branch_turn_number":1,"tool_name":null},"created_at":"…"}
    {"usage":{"branch_id":"main","user_turn_number":1,"requests":1,"input_tokens":10,"output_tokens":5,"total_tokens":15,"input_tokens_details":"{…}","output_tokens_details":null},"created_at":"…"}
    {"branch":"alt","created_at":"…"}

``structure``: where an item sits in a branch, the item named by its position
among the session's items in the file (1: the first); ``usage``: a turn's token
counts (the details as the JSON text stored); ``branch``: a name the session has
used. A session cleared in the store keeps the names it used (no header, no
items): one line per name, ``{"cleared_session":"s","branch":"alt","created_at":"…"}``,
after the sessions.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any, BinaryIO

from agents_memory._admin._advanced_copy import AdvancedRows, BranchName, TurnRow, UsageRow
from agents_memory._admin._errors import InvalidFileError
from agents_memory._admin._transfer import SourceSession
from agents_memory._codec import decode_json as _decode
from agents_memory._codec import encode_item
from agents_memory._crypto import Keyring, is_envelope
from agents_memory._ids import check_sql_int
from agents_memory._sqlalchemy._bulk import ItemRecord, SessionRecord
from agents_memory._sqlalchemy._timestamps import naive_utc
from agents_memory.models import BRANCH_ID_MAX_LENGTH

_HEADER_KEYS = frozenset({"session", "created_at", "updated_at", "metadata"})
_DEADLINE_KEYS = _HEADER_KEYS | {"expires_at"}
"""A header of a session with a deadline (files written before it had none still import)."""
_ITEM_KEYS = frozenset({"item", "created_at"})
_SEALED_KEYS = frozenset({"sealed", "created_at"})
"""An encrypted item exported without its key: the stored envelope, imported unchanged."""
_STRUCTURE_KEYS = frozenset({"structure", "created_at"})
_USAGE_KEYS = frozenset({"usage", "created_at"})
_BRANCH_KEYS = frozenset({"branch", "created_at"})
_CLEARED_KEYS = frozenset({"cleared_session", "branch", "created_at"})
_STRUCTURE_FIELDS = {
    "item": int,
    "branch_id": str,
    "message_type": str,
    "sequence_number": int,
    "user_turn_number": (int, None),
    "branch_turn_number": (int, None),
    "tool_name": (str, None),
}
_USAGE_FIELDS = {
    "branch_id": str,
    "user_turn_number": int,
    "requests": int,
    "input_tokens": int,
    "output_tokens": int,
    "total_tokens": int,
    "input_tokens_details": (str, None),
    "output_tokens_details": (str, None),
}
_ITEM_PREFIXES = ('{"item":', '{"sealed":')
"""How an item line as export writes it begins: counted without decoding once scanned."""


@dataclasses.dataclass(frozen=True, slots=True)
class ClearedName:
    """A branch name of a session cleared in the store (no header, no items)."""

    session_id: str
    name: BranchName


Advanced = TurnRow | UsageRow | BranchName
Record = SessionRecord | ItemRecord | Advanced | ClearedName


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


def advanced_lines(rows: AdvancedRows) -> str:
    """The lines of a session's advanced rows (written after its items)."""
    lines = []
    for turn in rows.turns:
        fields = {k: getattr(turn, k) for k in _STRUCTURE_FIELDS}
        fields["item"] = turn.item + 1
        lines.append({"structure": fields, "created_at": turn.created_at.isoformat()})
    for usage in rows.usage:
        fields = {k: getattr(usage, k) for k in _USAGE_FIELDS}
        lines.append({"usage": fields, "created_at": usage.created_at.isoformat()})
    lines.extend(
        {"branch": b.branch_id, "created_at": b.created_at.isoformat()} for b in rows.branches
    )
    return "".join(encode_item(line) + "\n" for line in lines)


def cleared_lines(session_id: str, names: list[BranchName]) -> str:
    """The lines of a session cleared in the store: the branch names it used."""
    return "".join(
        encode_item(
            {
                "cleared_session": session_id,
                "branch": n.branch_id,
                "created_at": n.created_at.isoformat(),
            }
        )
        + "\n"
        for n in names
    )


def _time(value: object, key: str) -> dt.datetime:
    if not isinstance(value, str):
        msg = f'"{key}" must be an ISO 8601 time string, got {type(value).__name__}'
        raise TypeError(msg)
    try:
        return dt.datetime.fromisoformat(value)
    except ValueError:
        msg = f'"{key}" is not an ISO 8601 time: {value!r}'
        raise ValueError(msg) from None


def _fields(value: object, key: str, kinds: dict[str, Any]) -> dict[str, Any]:
    """``value[key]``: an object with exactly these fields, each of its kind (ints in range)."""
    if not isinstance(value, dict) or frozenset(value) != frozenset(kinds):
        msg = f'"{key}" must be an object with the keys {sorted(kinds)}'
        raise ValueError(msg)
    for name, kind in kinds.items():
        allowed = kind if isinstance(kind, tuple) else (kind,)
        field = value[name]
        if field is None and None in allowed:
            continue
        if int in allowed and isinstance(field, int) and not isinstance(field, bool):
            check_sql_int(f'"{key}.{name}"', field)
            continue
        if str in allowed and isinstance(field, str):
            continue
        msg = (
            f'"{key}.{name}" must be {" or ".join(getattr(k, "__name__", "null") for k in allowed)}'
        )
        raise TypeError(msg)
    return value


_INT32 = 2**31
"""Turn numbers are 32-bit columns (``INTEGER``): checked here, not refused by the database."""


def _turns(fields: dict[str, Any], key: str, *names: str) -> None:
    for name in names:
        value = fields[name]
        if value is not None and not -_INT32 <= value < _INT32:
            msg = f'"{key}.{name}" must be a 32-bit integer, got {value}'
            raise ValueError(msg)


def _branch(value: object, key: str = "branch") -> str:
    if not isinstance(value, str) or not value or len(value) > BRANCH_ID_MAX_LENGTH:
        msg = f'"{key}" must be a branch name (text of 1 to {BRANCH_ID_MAX_LENGTH} characters)'
        raise ValueError(msg)
    return value


def _advanced(value: dict[str, Any], keys: frozenset[str]) -> Advanced | ClearedName | None:
    """An advanced session's line (or a cleared session's), or ``None`` if it is not one."""
    if keys not in (_STRUCTURE_KEYS, _USAGE_KEYS, _BRANCH_KEYS, _CLEARED_KEYS):
        return None
    when = naive_utc(_time(value["created_at"], "created_at"))
    if keys == _STRUCTURE_KEYS:
        f = _fields(value["structure"], "structure", _STRUCTURE_FIELDS)
        if f["item"] < 1:
            msg = '"structure.item" must be 1 or more (the position of the session\'s item)'
            raise ValueError(msg)
        _branch(f["branch_id"], "structure.branch_id")
        _turns(f, "structure", "user_turn_number", "branch_turn_number")
        rest = {k: f[k] for k in _STRUCTURE_FIELDS if k != "item"}
        return TurnRow(item=f["item"] - 1, created_at=when, **rest)
    if keys == _USAGE_KEYS:
        f = _fields(value["usage"], "usage", _USAGE_FIELDS)
        _branch(f["branch_id"], "usage.branch_id")
        _turns(f, "usage", "user_turn_number")
        return UsageRow(created_at=when, **f)
    name = BranchName(_branch(value["branch"]), when)
    if keys == _BRANCH_KEYS:
        return name
    sid = SessionRecord(value["cleared_session"], when, when).validated().session_id
    return ClearedName(sid, name)


def _parse(value: object) -> Record:
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
    advanced = _advanced(value, keys)
    if advanced is not None:
        return advanced
    msg = (
        'expected a session header {"session", "created_at", "updated_at", "metadata"} '
        f'or an item {{"item", "created_at"}}, got keys {sorted(keys)}'
    )
    raise ValueError(msg)


def parse_line(text: str, lineno: int) -> Record:
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


def _lines(stream: BinaryIO) -> Iterator[tuple[int, str]]:
    """Each non-blank line's text; bytes are decoded line by line, so errors name their line."""
    for lineno, raw in enumerate(stream, 1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            msg = f"line {lineno}: the file is not UTF-8 text ({exc.reason} at byte {exc.start})"
            raise InvalidFileError(msg) from None
        if text.strip():
            yield lineno, text


def _records(stream: BinaryIO) -> Iterator[tuple[int, Record]]:
    """Each non-blank line parsed."""
    for lineno, text in _lines(stream):
        yield lineno, parse_line(text, lineno)


@dataclasses.dataclass(frozen=True, slots=True)
class Scan:
    """What a valid file holds."""

    sessions: int
    items: int
    advanced: bool = False
    """Whether it holds advanced sessions' rows or cleared sessions' names."""


class _SessionCheck:
    """The rules for one session's lines: items, then its advanced rows (each key once)."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.items = 0
        self.advanced = False
        self.usage: set[tuple[str, int]] = set()
        self.branches: set[str] = set()

    def item(self) -> str | None:
        self.items += 1
        if self.advanced:
            return "an item after the session's structure, usage or branch lines; items first"
        return None

    def row(self, record: Advanced) -> str | None:
        self.advanced = True
        sid = self.session_id
        if isinstance(record, TurnRow) and record.item >= self.items:
            return (
                f"structure row of item {record.item + 1}, but session {sid!r} has "
                f"{self.items} items before it"
            )
        if isinstance(record, UsageRow):
            key = (record.branch_id, record.user_turn_number)
            if key in self.usage:
                return f"usage of branch {key[0]!r} turn {key[1]} twice in session {sid!r}"
            self.usage.add(key)
        if isinstance(record, BranchName):
            if record.branch_id in self.branches:
                return f"branch {record.branch_id!r} twice in session {sid!r}"
            self.branches.add(record.branch_id)
        return None


def scan(stream: BinaryIO, keyring: Keyring | None = None) -> Scan:
    """Validate a whole file before anything is written; return its totals.

    With ``keyring`` (an encrypting import) every sealed item must open with it:
    one under a key id it lacks is a :class:`~agents_memory.MissingKeyError`, a
    wrong key or an altered item a :class:`~agents_memory.DecryptionError`, naming
    the line and the key id, before anything is written. Otherwise the store would
    hold rows its own keyring cannot read (nor clear, pop or prune).
    """
    sessions = items = 0
    advanced = False
    first: dict[str, int] = {}
    current: _SessionCheck | None = None
    for lineno, record in _records(stream):
        if keyring is not None and isinstance(record, ItemRecord) and record.sealed is not None:
            keyring.decrypt(record.sealed, row_id=f"on line {lineno}", cache=False)
        problem = None
        if isinstance(record, SessionRecord):
            sid = record.session_id
            if sid in first:
                msg = f"line {lineno}: session {sid!r} already began on line {first[sid]}"
                raise InvalidFileError(msg + "; give each session one header")
            first[sid] = lineno
            sessions += 1
            current = _SessionCheck(sid)
        elif isinstance(record, ClearedName):
            advanced, current = True, None
        elif current is None:
            msg = f'line {lineno}: an item comes before any session header ({{"session": …}})'
            raise InvalidFileError(msg)
        elif isinstance(record, ItemRecord):
            items += 1
            problem = current.item()
        else:
            advanced = True
            problem = current.row(record)
        if problem is not None:
            raise InvalidFileError(f"line {lineno}: {problem}; fix the file")
    return Scan(sessions, items, advanced)


class Reader:
    """Stream a (scanned) file as :func:`~agents_memory._admin._transfer.transfer` pages.

    Each page is one session; its items are read on demand, and any the writer
    did not read are skipped before the next header. Advanced rows and cleared
    sessions' names are not the writer's: :func:`advanced_records` reads them.
    """

    def __init__(self, stream: BinaryIO) -> None:
        self._records = _records(stream)
        self._header: SessionRecord | ItemRecord | None = None
        self._in_session = False

    def _next(self) -> SessionRecord | ItemRecord | None:
        for _lineno, record in self._records:
            if isinstance(record, SessionRecord | ItemRecord):
                return record
        return None

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


Block = tuple[str, AdvancedRows | list[BranchName]]
"""A session's advanced rows, or a cleared session's names, by session id."""


def _starts(record: Record, block: Block | None) -> Block | None:
    """The block ``record`` opens (``None``: it belongs to the current one)."""
    if isinstance(record, SessionRecord):
        return record.session_id, AdvancedRows(0)
    if isinstance(record, ClearedName):
        if block is not None and block[0] == record.session_id and isinstance(block[1], list):
            return None
        return record.session_id, []
    return None


def _add(block: Block, record: Record) -> None:
    rows = block[1]
    if isinstance(rows, list):
        if isinstance(record, ClearedName):
            rows.append(record.name)
    elif isinstance(record, TurnRow):
        rows.turns.append(record)
    elif isinstance(record, UsageRow):
        rows.usage.append(record)
    elif isinstance(record, BranchName):
        rows.branches.append(record)


def advanced_records(stream: BinaryIO) -> Iterator[Block]:
    """A (scanned) file's advanced sessions, ``(id, rows)``, and cleared ones, ``(id, names)``.

    Item lines as export writes them are counted, not decoded (the scan has
    decoded every line already); a session without advanced rows is left out.
    One session's rows are held at a time.
    """
    block: Block | None = None
    for lineno, text in _lines(stream):
        record = None if text.startswith(_ITEM_PREFIXES) else parse_line(text, lineno)
        if record is None or isinstance(record, ItemRecord):
            if block is not None and isinstance(block[1], AdvancedRows):
                block[1].items += 1
            continue
        start = _starts(record, block)
        if start is not None:
            if block is not None and block[1]:
                yield block
            block = start
        if block is not None:
            _add(block, record)
    if block is not None and block[1]:
        yield block
