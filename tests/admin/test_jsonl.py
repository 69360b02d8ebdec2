"""The export format: lines that say what they are, parsed and validated with line numbers."""

from __future__ import annotations

import datetime as dt
import io

import pytest

from agents_memory._admin._errors import InvalidFileError
from agents_memory._admin._jsonl import Reader, header_line, item_line, parse_line, scan
from agents_memory._sqlalchemy._bulk import ItemRecord, SessionRecord

TIMES = '"created_at": "2024-01-01", "updated_at": "2024-01-01"'
T0 = dt.datetime.fromisoformat("2024-05-01 09:30:00.000125")


def test_lines_round_trip_exactly() -> None:
    """Headers and items, unicode and lone surrogates included, parse back to the same records."""
    header = SessionRecord("s-☔", T0, T0, {"user": "ü"})
    entry = ItemRecord({"text": "日本語 \ud800 \x00", "n": [1.5, None, True]}, T0)
    assert parse_line(header_line(header), 1) == header
    assert parse_line(item_line(entry), 2) == entry
    assert "☔" in header_line(header)  # non-ASCII text is written as is


def test_an_item_that_looks_like_a_header_is_still_an_item() -> None:
    """Whatever keys an item has, its line is an item line."""
    entry = ItemRecord({"session": "x", "created_at": "y", "updated_at": "z", "metadata": {}}, T0)
    assert parse_line(item_line(entry), 1) == entry


def test_offsets_are_converted_to_utc() -> None:
    """A time with an offset becomes the naive UTC time the schema keeps."""
    line = '{"session":"s","created_at":"2024-05-01T11:30:00+02:00",'
    line += '"updated_at":"2024-05-01T09:30:00Z","metadata":null}'
    parsed = parse_line(line, 1)
    assert isinstance(parsed, SessionRecord)
    assert (
        parsed.created_at == parsed.updated_at == dt.datetime.fromisoformat("2024-05-01 09:30:00")
    )


@pytest.mark.parametrize(
    ("line", "match"),
    [
        ("{not json", "line 7: not valid JSON"),
        ("[1, 2]", "line 7: expected a JSON object"),
        ('{"item": {"a": NaN}, "created_at": "2024-01-01"}', "NaN is not valid JSON"),
        ('{"item": {"a": 1e999}, "created_at": "2024-01-01"}', "NaN, Infinity"),
        ('{"item": [1], "created_at": "2024-01-01"}', "must be a dict"),
        ('{"item": {}, "created_at": "yesterday"}', "not an ISO 8601 time"),
        ('{"item": {}}', "got keys"),
        ('{"session": "", %s, "metadata": null}' % TIMES, "must not be empty"),  # noqa: UP031
        ('{"session": "s", %s, "metadata": [1]}' % TIMES, "metadata"),  # noqa: UP031
    ],
)
def test_bad_lines_name_the_line(line: str, match: str) -> None:
    """Each kind of bad line is an InvalidFileError with its line number and the reason."""
    with pytest.raises(InvalidFileError, match=match):
        parse_line(line, 7)


def _file(*lines: str) -> io.BytesIO:
    text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    return io.BytesIO(text.encode("utf-8"))


def test_scan_counts_and_checks_the_whole_file() -> None:
    """A valid file's totals; blank lines are ignored."""
    a, b = SessionRecord("a", T0, T0), SessionRecord("b", T0, T0)
    entry = ItemRecord({"x": 1}, T0)
    text = _file(header_line(a), item_line(entry), "", header_line(b), item_line(entry))
    totals = scan(text)
    assert (totals.sessions, totals.items) == (2, 2)


def test_scan_refuses_items_before_a_header_and_repeated_sessions() -> None:
    """Structure errors are found before anything is written."""
    a = SessionRecord("a", T0, T0)
    entry = item_line(ItemRecord({"x": 1}, T0))
    with pytest.raises(InvalidFileError, match="line 1: an item comes before"):
        scan(_file(entry))
    with pytest.raises(InvalidFileError, match="line 3: session 'a' already began on line 1"):
        scan(_file(header_line(a), entry, header_line(a)))


async def test_reader_skips_items_nobody_read() -> None:
    """Sessions come one per page; unread items are skipped, not taken for the next session."""
    a, b = SessionRecord("a", T0, T0), SessionRecord("b", T0, T0)
    x, y = ItemRecord({"x": 1}, T0), ItemRecord({"y": 2}, T0)
    reader = Reader(_file(header_line(a), item_line(x), item_line(x), header_line(b), item_line(y)))
    seen = []
    async for page in reader.pages():
        (src,) = page
        if src.record.session_id == "b":
            seen.append((src.record, [e async for e in src.items()]))
        else:
            seen.append((src.record, []))
    assert seen == [(a, []), (b, [y])]
