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


def _fast_encoder() -> Callable[[Any], bytes] | None:
    """``orjson.dumps`` where it is installed (a dependency on CPython), else ``None``.

    It encodes an item about ten times faster than ``json`` (1.6 µs against 13 µs
    for a turn of four items), which is a fifth of what ``add_items`` costs the
    event loop. It is used only for items it encodes exactly as ``json`` would
    decode them back (see :func:`_check_keys`); everything else, and every
    error, takes the ``json`` path, so what is accepted, refused and stored does
    not depend on whether it is installed.
    """
    try:
        import orjson  # noqa: PLC0415 - optional: PyPy has no wheel
    except ImportError:
        return None
    dumps: Callable[[Any], bytes] = orjson.dumps
    return dumps


_fast_dumps = _fast_encoder()


def _reject_constant(name: str) -> None:
    """NaN and Infinity are refused on write, so a stored one is corrupt, not an item."""
    msg = f"{name} is not valid JSON"
    raise ValueError(msg)


_decoder = json.JSONDecoder(parse_constant=_reject_constant)
decode_json = _decoder.decode
"""``json.loads`` that refuses NaN and Infinity, as every writer of ours does."""
_raw_decode = _decoder.raw_decode


def _decode(text: str) -> Any:  # noqa: ANN401 - whatever the JSON holds
    """:data:`decode_json`, without its two whitespace regexes for a row that has none.

    ``decode`` is ``raw_decode`` between a regex match for leading and one for
    trailing whitespace; on a read of 20 items those two were a quarter of the
    decoding (44 → 32 µs). Stored rows have no whitespace around them (ours never
    write any), so ``raw_decode`` alone decides; a row with some, or one that is
    not JSON, goes to ``decode_json``, whose answer or error stands as before.
    """
    try:
        value, end = _raw_decode(text)
    except ValueError:
        return decode_json(text)
    return value if end == len(text) else decode_json(text)


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
    if not isinstance(item, dict):
        msg = f"item {index} must be a dict (a Responses-API input item), got {type(item).__name__}"
        raise TypeError(msg)
    plain = _check_keys(item)
    if plain and not ensure_ascii and _fast_dumps is not None:
        try:
            return _fast_dumps(item).decode()
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
    """Encode a whole batch up front, so that one bad item rejects the batch before any write."""
    if isinstance(items, str | bytes | dict) or not isinstance(items, Sequence):
        msg = f"items must be a list of dicts, got {type(items).__name__}"
        raise TypeError(msg)
    return [encode_item(item, index=i, ensure_ascii=ensure_ascii) for i, item in enumerate(items)]


def decode_row(
    data: object, *, row_id: object, on_corrupt: OnCorrupt, keyring: Keyring | None = None
) -> dict[str, Any] | None:
    """Decode one stored row; ``None`` means it is not a JSON object and was skipped.

    An encrypted row is opened with ``keyring`` first. One that cannot be opened
    (no keyring, a key it lacks, a wrong key, altered ciphertext) raises the typed
    :class:`~agents_memory.DecryptionError` whatever ``on_corrupt`` says: a pop
    that meets it rolls back, so nothing is deleted because it could not be read.
    """
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

    Encrypted rows are opened with ``keyring`` (see :func:`decode_row`).
    """
    out: list[dict[str, Any]] = []
    for row_id, stored in rows:
        data = stored
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
