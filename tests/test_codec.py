"""The JSON rule for items: exact round trip or a typed error."""

from __future__ import annotations

import collections
import enum
import json
import logging
import os
import re
import uuid
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from agents_memory import CorruptItemError, _codec
from agents_memory._codec import (
    MAX_NESTING,
    STORED_MARK,
    decode_row,
    decode_rows,
    encode_item,
    encode_items,
)

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
        monkeypatch.setattr(_codec, "_fast_loads", None)
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


def _decoded(decode: Any, text: str) -> tuple[str, Any]:
    try:
        return "value", decode(text)
    except (ValueError, TypeError, RecursionError) as exc:
        return "error", (type(exc), str(exc))


@pytest.mark.parametrize(
    "text",
    [
        '{"a":1}',
        ' {"a":1}',
        '{"a":1}\n',
        '\t{"a": [1, 2]} ',
        '{"a":1} x',
        "\ufeff{}",
        "",
        " ",
        "[1]",
    ],
)
def test_reads_decode_as_json_loads_would_with_whitespace_or_junk_around(text: str) -> None:
    """The fast decode (``raw_decode`` alone) gives way to ``decode`` when there is more."""
    assert _decoded(_codec._decode, text) == _decoded(_codec.decode_json, text)


@given(
    st.one_of(
        st.text(max_size=30),
        st.builds(
            lambda pre, value, post: pre + json.dumps(value) + post,
            st.sampled_from(["", " ", "\n", "x"]),
            st.recursive(
                st.none() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c),
                max_leaves=8,
            ),
            st.sampled_from(["", " ", "\r\n", "}", "{}"]),
        ),
    )
)
def test_any_text_decodes_to_what_json_loads_gives(text: str) -> None:
    """Same value, or the same error (type and message), for any stored text.

    Except a marked text holding an integer beyond 64 bits, which only a writer
    other than ours can store (see ``STORED_MARK``; tested below).
    """
    assume(not (text.endswith(STORED_MARK) and re.search(r"\d{19}", text)))
    assert _decoded(_codec._decode, text) == _decoded(_codec.decode_json, text)


def test_a_scalar_subclass_at_the_nesting_limit_is_a_leaf(encoder: str) -> None:
    """A str or int subclass is a value, not one more level: at the limit it is stored."""
    for leaf in (Text("deep"), Name.ADA):
        value: object = leaf
        for _ in range(MAX_NESTING - 1):
            value = [value]
        item = {"v": value}
        assert json.loads(encode_item(item)) == json.loads(json.dumps(item))


plain_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=20,
)


@given(st.dictionaries(st.text(max_size=5), plain_values, max_size=5))
def test_stored_rows_read_back_exactly_as_json_reads_them(item: dict[str, Any]) -> None:
    """What ``encode_items`` stores decodes (as text and as SQLite's bytes) to json's answer.

    Compared by ``repr``: an int is not a float, ``-0.0`` not ``0.0``. Ints past
    64 bits are in the strategy: those items are written by json, unmarked.
    """
    [text] = encode_items([item])
    want = repr(json.loads(text))
    for stored in (text, text.encode()):
        assert repr(decode_rows([(1, stored)], on_corrupt="raise")) == f"[{want}]"
        assert repr(decode_row(stored, row_id=1, on_corrupt="raise")) == want


def test_items_orjson_wrote_are_marked_and_no_others(encoder: str) -> None:
    """The mark ends exactly the stored texts of the fast encoder; ``encode_item`` never adds it."""
    plain = {"role": "user", "content": "é", "n": [1, 2.5, None, True]}
    big = {"n": 2**64}  # orjson refuses it: json writes it
    [text, big_text] = encode_items([plain, big])
    assert text.endswith(STORED_MARK) == (encoder == "orjson")
    assert not big_text.endswith(STORED_MARK)
    assert not encode_item(plain).endswith(STORED_MARK)
    assert not encode_items([plain], ensure_ascii=True)[0].endswith(STORED_MARK)
    assert json.loads(text) == plain  # any JSON reader: the mark is whitespace


@pytest.mark.parametrize(
    ("stored", "want"),
    [
        ('{"n":123456789012345678901234567890}', {"n": 123456789012345678901234567890}),
        ('{"s":"\\ud800"}\t', {"s": "\ud800"}),  # orjson refuses a lone surrogate: json's answer
        ('{"f":1e400}\t', {"f": float("inf")}),  # orjson refuses it too
        ('{"a":1,"a":2}\t', {"a": 2}),
        (' {"a":1}\t', {"a": 1}),
    ],
)
def test_rows_orjson_would_misread_or_refuses_get_jsons_answer(
    encoder: str, stored: str, want: dict[str, Any]
) -> None:
    """An unmarked big int stays an int; what orjson refuses is decoded by json, as before."""
    for data in (stored, stored.encode()):
        got = decode_rows([(1, data)], on_corrupt="raise")
        assert repr(got) == repr([want])
        assert repr(decode_row(data, row_id=1, on_corrupt="raise")) == repr(want)


def test_a_forged_marked_row_with_a_big_int_reads_as_orjson_reads_it(encoder: str) -> None:
    """The one difference the mark allows, stated: such a row is not one any writer of ours makes.

    A marked row is decoded by ``orjson``, which reads an integer past 64 bits as
    a float; ours never mark such a text (``test_items_orjson_wrote_are_marked_and_no_others``).
    """
    stored = '{"n":123456789012345678901234567890}' + STORED_MARK
    [got] = decode_rows([(1, stored)], on_corrupt="raise")
    assert type(got["n"]) is (float if encoder == "orjson" else int)


def test_bytes_that_are_not_utf8_are_a_corrupt_row(caplog: pytest.LogCaptureFixture) -> None:
    """SQLite's reads hand over bytes; invalid UTF-8 (marked or not) is skipped or raised."""
    rows = [(1, b'{"a":"\xff"}\t'), (2, b'{"b":"\xfe"}'), (3, b'{"c":3}')]
    with caplog.at_level(logging.WARNING, logger="agents_memory"):
        assert decode_rows(rows, on_corrupt="skip") == [{"c": 3}]
    assert "stored item 1: not valid JSON" in caplog.text
    assert "stored item 2: not valid JSON" in caplog.text
    with pytest.raises(CorruptItemError, match="stored item 1"):
        decode_rows(rows, on_corrupt="raise")
