"""The one JSON rule for stored items: what may be written, and how rows are read back.

Items are validated and encoded *before* any statement runs, so a bad item in a
batch means nothing of that batch is written.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from agents_memory._crypto import ENVELOPE_MARK, FORMAT, is_envelope, open_envelope
from agents_memory._errors import CorruptItemError

if TYPE_CHECKING:
    from agents_memory._crypto import Keyring

logger = logging.getLogger("agents_memory")

OnCorrupt: TypeAlias = Literal["skip", "raise"]
"""What a read does with a stored row whose JSON does not decode."""

_encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_ascii_encoder = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def _orjson() -> Any:  # noqa: ANN401 - the module, or None
    """``orjson`` where it is installed (a dependency on CPython), else ``None`` (PyPy)."""
    try:
        import orjson  # noqa: PLC0415 - optional: PyPy has no wheel
    except ImportError:
        return None
    return orjson


_orjson_module = _orjson()

_fast_dumps: Callable[[Any], bytes] | None = (
    None if _orjson_module is None else _orjson_module.dumps
)
"""``orjson.dumps``: encodes an item about ten times faster than ``json``.

1.6 µs against 13 µs for a turn of four items, a fifth of what ``add_items``
costs the event loop. It is used only for items it encodes exactly as ``json``
would decode them back (see :func:`_check_keys`); everything else, and every
error, takes the ``json`` path, so what is accepted or refused, and what reads
return, does not depend on whether it is installed (only the text stored: ``orjson``'s
ends with :data:`STORED_MARK`).
"""

_fast_loads: Callable[[str | bytes], Any] | None = (
    None if _orjson_module is None else _orjson_module.loads
)
"""``orjson.loads``, for rows that end with :data:`STORED_MARK` only (see there)."""

STORED_MARK = "\t"
"""What ends every stored item that ``orjson`` wrote: a read may decode it with ``orjson`` too.

``orjson.loads`` reads a row faster than ``json`` does (and straight from the
UTF-8 bytes SQLite hands over), but it does not read every text as ``json``
does: an integer beyond 64 bits comes back as a float. It reads exactly as
``json`` does the texts ``orjson.dumps`` writes (it never writes such an
integer: those items take the ``json`` path, see :func:`encode_items`), so only
those are given to it, and they are told apart by this trailing tab, which JSON
allows as whitespace: any JSON reader, ours before this mark or the Agents SDK's,
decodes the row as before. A row without it (written by ``json``, by an older
version, by the SDK or by hand) is decoded by ``json``. Anything ``orjson``
refuses is decoded by ``json`` as well, so its answer or error stands.
"""
_STORED_MARK_BYTES = STORED_MARK.encode()


def _reject_constant(name: str) -> None:
    """NaN and Infinity are refused on write, so a stored one is corrupt, not an item."""
    msg = f"{name} is not valid JSON"
    raise ValueError(msg)


_decoder = json.JSONDecoder(parse_constant=_reject_constant)
decode_json = _decoder.decode
"""``json.loads`` that refuses NaN and Infinity, as every writer of ours does."""
_raw_decode = _decoder.raw_decode


def _fast(data: str | bytes) -> Any:  # noqa: ANN401 - whatever the JSON holds
    """A marked row decoded by ``orjson`` (from ``str``, or from bytes with no ``str`` made).

    ``None`` when it is not marked, ``orjson`` refuses it, or it is JSON ``null``:
    the caller decodes it with ``json``, whose answer or error stands.
    """
    mark = _STORED_MARK_BYTES if type(data) is bytes else STORED_MARK
    if _fast_loads is None or not data.endswith(mark):  # type: ignore[arg-type]
        return None
    try:
        return _fast_loads(data)
    except ValueError:  # (orjson.JSONDecodeError)
        return None


def _decode(text: str) -> Any:  # noqa: ANN401 - whatever the JSON holds
    """:data:`decode_json`, faster: ``orjson`` for a marked row, else ``raw_decode`` alone.

    A row ending with :data:`STORED_MARK` was written by ``orjson`` and goes to
    ``orjson.loads`` (29 → 18 µs a read of 20 items). Any other goes to
    ``raw_decode``: ``decode`` is ``raw_decode`` between a regex match for leading
    and one for trailing whitespace, and on a read of 20 items those two were a
    quarter of the decoding (44 → 32 µs); stored rows have no whitespace around
    them but the mark, so ``raw_decode`` alone decides. A row with anything
    else around it, or one that is not JSON, goes to ``decode_json``, whose
    answer or error stands as before.
    """
    value = _fast(text)
    if value is not None:
        return value
    try:
        value, end = _raw_decode(text)
    except ValueError:
        return decode_json(text)
    if end == len(text) or text[end:] == STORED_MARK:
        return value
    return decode_json(text)


_CURRENT = FORMAT + ":"

_LEAVES = frozenset({str, int, bool, type(None)})
"""Exactly these types (not subclasses) need no look inside; ``float`` is checked for finiteness."""
_SCALARS = (str, int, float)
"""What ``json`` writes as a scalar, subclasses included (never looked into, so never too deep)."""

MAX_NESTING = 200
"""Deepest nesting of dicts and lists an item may have.

``json`` recurses on the C stack: an item nested near the interpreter's recursion
limit could be written from a shallow stack and then fail to decode (``RecursionError``)
on every later read, and a self-referencing item would never finish encoding. Real
Responses-API items nest a handful of levels deep.
"""


def _check_keys(item: dict[str, Any]) -> bool:
    """Reject non-string keys (``json`` would silently turn them into strings) and deep nesting.

    Such an item would not come back as it went in (or not at all), so it is refused
    instead. Returns whether the fast encoder may write it: every container a
    plain ``dict``, ``list`` or ``tuple``, every key a plain ``str``, every value
    of exactly a JSON type and every float finite. Anything else (a subclass, a
    ``UUID``, an ``Enum``, NaN) goes to ``json``, which encodes or refuses it as
    it always has: ``orjson`` would write some of those (a UUID as a string, NaN
    as ``null``) where ``json`` refuses them.
    """
    plain = True
    stack: list[tuple[Any, int]] = [(item, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_NESTING:
            msg = (
                f"item is nested more than {MAX_NESTING} levels deep (or refers to itself); "
                "flatten it or store the deep part as a JSON string"
            )
            raise ValueError(msg)
        opened = _open(value)
        if opened is None:
            plain = False  # a str subclass, a UUID, a set...: json decides
            continue
        children, plain_here = opened
        plain = plain and plain_here
        for child in children:
            kind = type(child)
            if kind in _LEAVES:
                continue
            if kind is float:
                plain = plain and math.isfinite(child)
                continue
            if isinstance(child, _SCALARS):  # a subclass (IntEnum, StrEnum): json's, no deeper
                plain = False
                continue
            stack.append((child, depth + 1))
    return plain


def _open(value: object) -> tuple[Iterable[Any], bool] | None:
    """A container's values, and whether it and its keys are plain; ``None`` for a non-container.

    Raises on a key that is not a string.
    """
    if isinstance(value, dict):
        plain = type(value) is dict
        for key in value:
            if type(key) is not str:
                if not isinstance(key, str):
                    msg = f"item keys must be str, got {type(key).__name__} key {key!r}"
                    raise TypeError(msg)
                plain = False
        return value.values(), plain
    if isinstance(value, list | tuple):
        return value, type(value) in {list, tuple}
    return None


def encode_item(item: object, *, index: int = 0, ensure_ascii: bool = False) -> str:
    """Encode one item; raise ``TypeError``/``ValueError`` if it would not round-trip.

    ``ensure_ascii=True`` escapes every non-ASCII character in JSON, the Agents
    SDK's ``SQLAlchemySession`` default; either form decodes to the same item.
    """
    return _encode(item, index, ensure_ascii=ensure_ascii, mark=b"")


def _encode(item: object, index: int, *, ensure_ascii: bool, mark: bytes) -> str:
    """:func:`encode_item`; the fast encoder's text ends with ``mark``."""
    if not isinstance(item, dict):
        msg = f"item {index} must be a dict (a Responses-API input item), got {type(item).__name__}"
        raise TypeError(msg)
    plain = _check_keys(item)
    if plain and not ensure_ascii and _fast_dumps is not None:
        try:
            return (_fast_dumps(item) + mark).decode()
        except TypeError:  # an int beyond 64 bits, a lone surrogate: json's rules, below
            pass
    try:
        text = (_ascii_encoder if ensure_ascii else _encoder).encode(item)
    except TypeError as exc:
        msg = f"item {index} is not JSON-serialisable: {exc}"
        raise TypeError(msg) from None
    except ValueError as exc:
        msg = f"item {index} holds a value JSON cannot represent (NaN, Infinity, a huge int): {exc}"
        raise ValueError(msg) from None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate cannot be stored as UTF-8; the \\u escape keeps it exactly.
        text = _ascii_encoder.encode(item)
    return text


def encode_items(items: Sequence[object], *, ensure_ascii: bool = False) -> list[str]:
    """Encode a whole batch to store, so that one bad item rejects the batch before any write.

    What the fast encoder writes ends with :data:`STORED_MARK`, so reads can
    decode it fast too.
    """
    if isinstance(items, str | bytes | dict) or not isinstance(items, Sequence):
        msg = f"items must be a list of dicts, got {type(items).__name__}"
        raise TypeError(msg)
    mark = _STORED_MARK_BYTES
    return [_encode(item, i, ensure_ascii=ensure_ascii, mark=mark) for i, item in enumerate(items)]


def encode_stored_item(item: object, *, index: int = 0) -> str:
    """One item to store (an import's, a copy's), encoded exactly as :func:`encode_items` does."""
    return _encode(item, index, ensure_ascii=False, mark=_STORED_MARK_BYTES)


def _text(data: bytes) -> str | bytes:
    """A row handed over as bytes (SQLite's reads), as text; invalid UTF-8 stays bytes (corrupt)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data


def decode_row(
    data: object, *, row_id: object, on_corrupt: OnCorrupt, keyring: Keyring | None = None
) -> dict[str, Any] | None:
    """Decode one stored row; ``None`` means it is not a JSON object and was skipped.

    An encrypted row is opened with ``keyring`` first. One that cannot be opened
    (no keyring, a key it lacks, a wrong key, altered ciphertext) raises the typed
    :class:`~agents_memory.DecryptionError` whatever ``on_corrupt`` says: a pop
    that meets it rolls back, so nothing is deleted because it could not be read.
    """
    if type(data) is bytes:
        value = _fast(data)
        if type(value) is dict:
            return value
        data = _text(data)
    if is_envelope(data):
        data = open_envelope(data, keyring, row_id=row_id)  # type: ignore[arg-type]
    reason = "not a JSON object"
    try:
        value = _decode(data.decode("utf-8") if isinstance(data, bytes) else data)  # type: ignore[arg-type]
    except RecursionError:
        reason = "JSON nested too deeply to decode"
    except (ValueError, TypeError, AttributeError) as exc:
        reason = f"not valid JSON ({exc})"
    else:
        if type(value) is dict:
            return value
    if on_corrupt == "raise":
        msg = f"stored item {row_id} is {reason}"
        raise CorruptItemError(msg)
    logger.warning("skipping stored item %s: %s", row_id, reason)
    return None


def decode_rows(
    rows: Iterable[Sequence[object]], *, on_corrupt: OnCorrupt, keyring: Keyring | None = None
) -> list[dict[str, Any]]:
    """Decode ``(id, message_data)`` rows in order, skipping (or raising on) corrupt ones.

    ``message_data`` is ``str``, or UTF-8 ``bytes`` (SQLite's reads: no text
    conversion in the driver). Encrypted rows are opened with ``keyring`` (see
    :func:`decode_row`).
    """
    out: list[dict[str, Any]] = []
    for row_id, stored in rows:
        data = stored
        if type(data) is bytes:
            value = _fast(data)
            if type(value) is dict:
                out.append(value)
                continue
            data = _text(data)
        # (is_envelope's answer, cheaper: this format's prefix first, the regex for others)
        if (
            keyring is not None
            and type(data) is str
            and data.startswith(ENVELOPE_MARK)
            and (data.startswith(_CURRENT) or is_envelope(data))
        ):
            data = keyring.decrypt(data, row_id=row_id)
        try:
            value = _decode(data)  # type: ignore[arg-type]  # fast path: str holding an object
        except (ValueError, TypeError, RecursionError):
            value = None
        if type(value) is dict:
            out.append(value)
            continue
        item = decode_row(data, row_id=row_id, on_corrupt=on_corrupt, keyring=keyring)
        if item is not None:
            out.append(item)
    return out
