"""The JSON rule for items: exact round trip or a typed error."""

from __future__ import annotations

import collections
import enum
import json
import logging
import os
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents_memory import CorruptItemError, _codec
from agents_memory._codec import MAX_NESTING, decode_rows, encode_item, encode_items

FAST = _codec._fast_dumps


@pytest.fixture(autouse=True, params=["orjson", "json"])
def encoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here once with the fast encoder (orjson) and once with ``json`` alone."""
    if request.param == "orjson" and FAST is None:
        if os.environ.get("CI"):  # (as tests/conftest.py's IN_CI: a skip there is a failure)
            pytest.fail("CI is set and orjson (a dependency on CPython) is not installed")
        pytest.skip("orjson is not installed: only the json path is tested")
    if request.param == "json":
        monkeypatch.setattr(_codec, "_fast_dumps", None)
    return str(request.param)


def _outcome(item: object) -> tuple[str, Any]:
    """What ``encode_item`` makes of ``item``: the decoded stored text, or the error's type."""
    try:
        return "stored", json.loads(encode_item(item))
    except (TypeError, ValueError) as exc:
        return "refused", type(exc)


def _on_json_alone(item: object) -> tuple[str, Any]:
    fast = _codec._fast_dumps
    _codec._fast_dumps = None
    try:
        return _outcome(item)
    finally:
        _codec._fast_dumps = fast


class Colour(enum.Enum):
    """A plain Enum: json refuses it, orjson would write its value."""

    RED = 1


class Name(enum.StrEnum):
    """A str subclass: json writes it as its text."""

    ADA = "ada"


class Text(str):
    """Another str subclass (as a value and as a key)."""

    __slots__ = ()


Pair = collections.namedtuple("Pair", "a b")  # noqa: PYI024 - a tuple subclass on purpose

EDGES: list[object] = [
    float("nan"),
    float("inf"),
    2**64,
    -(2**63) - 1,
    2**63,
    "lone \udc80 surrogate",
    uuid.UUID(int=7),
    Colour.RED,
    Name.ADA,
    Text("sub"),
    Pair(1, 2),
    (1, "two"),
    1e16,
    -0.0,
    {Text("k"): 1},
    b"bytes",
    {1, 2},
]


@pytest.mark.parametrize("value", EDGES, ids=repr)
def test_the_fast_encoder_stores_or_refuses_exactly_as_json(encoder: str, value: object) -> None:
    """Values orjson would write differently (a UUID, NaN as null) take the json path."""
    item = {"v": value, "nested": [{"v": value}]}
    assert _outcome(item) == _on_json_alone(item)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.sampled_from(EDGES),
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=20,
)


@given(st.dictionaries(st.text(max_size=5), json_values, max_size=5))
def test_any_item_gets_the_same_outcome_on_both_encoders(item: dict[str, Any]) -> None:
    """Stored (and what it decodes to) or refused (and the error's type) alike."""
    assert _outcome(item) == _on_json_alone(item)


def test_plain_items_are_written_by_the_fast_encoder(encoder: str) -> None:
    """On the orjson path a plain item's text is orjson's (so the fast path really runs)."""
    item = {"role": "user", "content": [{"type": "input_text", "text": "é", "n": 1.5}]}
    text = encode_item(item)
    assert json.loads(text) == item
    if encoder == "orjson":
        assert FAST is not None
        assert text == FAST(item).decode()


def test_encoding_is_compact_and_keeps_unicode() -> None:
    """Non-ASCII text is stored as UTF-8, not as escapes; output is valid JSON."""
    text = encode_item({"t": "é 中 😀"})
    assert text == '{"t":"é 中 😀"}'
    assert json.loads(text) == {"t": "é 中 😀"}


def test_lone_surrogate_is_escaped_and_round_trips() -> None:
    """A lone surrogate cannot be UTF-8; it is escaped so it still round-trips exactly."""
    item = {"t": "a\udc80b"}
    text = encode_item(item)
    text.encode("utf-8")
    assert json.loads(text) == item


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (None, TypeError),
        ([1], TypeError),
        ({"a": {1: 2}}, TypeError),
        ({"a": [{"b": object()}]}, TypeError),
        ({"a": float("-inf")}, ValueError),
    ],
)
def test_bad_items(bad: object, error: type[Exception]) -> None:
    """Non-dicts, non-string keys, unserialisable values and NaN/Infinity are refused."""
    with pytest.raises(error):
        encode_item(bad)


def test_batch_must_be_a_sequence_of_dicts() -> None:
    """A dict, string or generator is not a batch."""
    for bad in ({"a": 1}, "abc", b"abc", (x for x in [{}])):
        with pytest.raises(TypeError):
            encode_items(bad)  # type: ignore[arg-type]


def test_decode_skips_or_raises(caplog: pytest.LogCaptureFixture) -> None:
    """Corrupt rows are skipped with a warning, or raise CorruptItemError when asked."""
    rows = [(1, '{"a":1}'), (2, "{broken"), (3, "[1,2]"), (4, '{"b":2}')]
    with caplog.at_level(logging.WARNING, logger="agents_memory"):
        assert decode_rows(rows, on_corrupt="skip") == [{"a": 1}, {"b": 2}]
    assert "stored item 2" in caplog.text
    assert "stored item 3" in caplog.text
    with pytest.raises(CorruptItemError, match="stored item 2"):
        decode_rows(rows, on_corrupt="raise")


def test_self_referencing_item_is_refused() -> None:
    """An item that contains itself is a ValueError, not an endless loop."""
    item: dict[str, object] = {}
    item["self"] = item
    with pytest.raises(ValueError, match="nested more than"):
        encode_item(item)


def test_deep_nesting_is_refused_but_the_limit_round_trips() -> None:
    """Nesting past MAX_NESTING is refused up front; an item at the limit decodes again."""

    def nested(depth: int) -> dict[str, object]:
        value: object = 1
        for _ in range(depth - 1):
            value = [value]
        return {"v": value}

    ok = nested(MAX_NESTING)
    assert decode_rows([(1, encode_item(ok))], on_corrupt="raise") == [ok]
    with pytest.raises(ValueError, match="nested more than"):
        encode_item(nested(MAX_NESTING + 1))
    with pytest.raises(ValueError, match="nested more than"):
        encode_item(nested(100_000))


def test_too_deep_stored_json_is_corrupt_not_a_crash(caplog: pytest.LogCaptureFixture) -> None:
    """A stored row nested too deeply for the decoder is skipped (or raised as corrupt)."""
    rows = [(1, "[" * 100_000 + "]" * 100_000), (2, '{"b":2}')]
    with caplog.at_level(logging.WARNING, logger="agents_memory"):
        assert decode_rows(rows, on_corrupt="skip") == [{"b": 2}]
    assert "nested too deeply" in caplog.text
    with pytest.raises(CorruptItemError, match="stored item 1"):
        decode_rows(rows, on_corrupt="raise")


def test_stored_nan_or_infinity_is_corrupt() -> None:
    """NaN/Infinity are refused on write, so a stored one is a corrupt row, not an item."""
    rows = [(1, '{"a":NaN}'), (2, '{"b":-Infinity}'), (3, '{"c":1}')]
    assert decode_rows(rows, on_corrupt="skip") == [{"c": 1}]
    with pytest.raises(CorruptItemError, match="stored item 1"):
        decode_rows(rows, on_corrupt="raise")
