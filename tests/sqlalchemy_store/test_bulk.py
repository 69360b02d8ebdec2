"""The timestamp-preserving bulk path: what copy, export and import stand on."""

from __future__ import annotations

import datetime as dt

import pytest

from agents_memory import SessionStore
from agents_memory._sqlalchemy._bulk import ItemRecord, SessionRecord, SessionWrite, bulk_for

T0 = dt.datetime.fromisoformat("2024-03-01 12:00:00.250000")


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


async def test_write_keeps_times_order_and_metadata(store: SessionStore) -> None:
    """Rows and items come back with exactly the times, order and metadata written."""
    bulk = bulk_for(store)
    items = [ItemRecord({"n": i, "text": "héllo ☔"}, at(i)) for i in range(5)]
    await bulk.write(
        [
            SessionWrite(SessionRecord("a", at(0), at(9), {"user": "u1"}), items),
            SessionWrite(SessionRecord("empty", at(1), at(2))),
        ]
    )
    states = await bulk.states_after(None, 10)
    assert [s.record for s in states] == [
        SessionRecord("a", at(0), at(9), {"user": "u1"}),
        SessionRecord("empty", at(1), at(2), None),
    ]
    assert [s.item_count for s in states] == [5, 0]
    assert states[0].last_item == items[-1]
    assert states[1].last_item is None
    assert [r async for r in bulk.rows("a", batch_size=2)] == items
    assert await store.session("a").get_items() == [i.item for i in items]


async def test_written_times_page_like_database_stamped_ones(store: SessionStore) -> None:
    """Whole-second times are stored as the database stamps them, so keyset pages stay exact."""
    bulk = bulk_for(store)
    second = T0.replace(microsecond=0)
    await bulk.write([SessionWrite(SessionRecord(sid, second, second)) for sid in ("x", "y")])
    page = await store.list_sessions(limit=1)
    assert [s.session_id for s in page.sessions] == ["y"]
    assert page.next_cursor is not None
    rest = await store.list_sessions(limit=5, cursor=page.next_cursor)
    assert [s.session_id for s in rest.sessions] == ["x"]


async def test_write_appends_or_replaces_an_existing_session(store: SessionStore) -> None:
    """Items go after the existing ones; with replace, the old ones are deleted first."""
    bulk = bulk_for(store)
    await store.session("s").add_items([{"old": 1}])
    record = SessionRecord("s", at(0), at(5), {"k": "v"})
    await bulk.write([SessionWrite(record, [ItemRecord({"new": 1}, at(1))])])
    assert await store.session("s").get_items() == [{"old": 1}, {"new": 1}]
    await bulk.write([SessionWrite(record, [ItemRecord({"new": 2}, at(2))], replace=True)])
    assert await store.session("s").get_items() == [{"new": 2}]
    assert (await bulk.states_of(["s"]))["s"].record == record


async def test_aware_times_are_stored_as_utc(store: SessionStore) -> None:
    """A time with an offset is converted to the naive UTC the schema keeps."""
    bulk = bulk_for(store)
    paris = dt.timezone(dt.timedelta(hours=2))
    local = dt.datetime(2024, 3, 1, 14, 0, tzinfo=paris)
    await bulk.write([SessionWrite(SessionRecord("tz", local, local))])
    state = (await bulk.states_of(["tz"]))["tz"]
    assert state.record.created_at == dt.datetime.fromisoformat("2024-03-01 12:00:00")


@pytest.mark.parametrize(
    ("write", "error", "match"),
    [
        (SessionWrite(SessionRecord("", T0, T0)), ValueError, "must not be empty"),
        (SessionWrite(SessionRecord("s", "2024-01-01", T0)), TypeError, "created_at"),  # type: ignore[arg-type]
        (SessionWrite(SessionRecord("s", T0, T0, {"x": float("nan")})), ValueError, "NaN"),
        (
            SessionWrite(SessionRecord("s", T0, T0), [ItemRecord({1: "x"}, T0)]),  # type: ignore[dict-item]
            TypeError,
            "keys must be str",
        ),
        (
            SessionWrite(SessionRecord("s", T0, T0), [ItemRecord({"x": 1}, None)]),  # type: ignore[arg-type]
            TypeError,
            "item 0 created_at",
        ),
    ],
)
async def test_bad_records_write_nothing(
    store: SessionStore, write: SessionWrite, error: type[Exception], match: str
) -> None:
    """An invalid record anywhere in a batch is a typed error naming it, and nothing is written."""
    bulk = bulk_for(store)
    good = SessionWrite(SessionRecord("good", T0, T0), [ItemRecord({"ok": True}, T0)])
    with pytest.raises(error, match=match):
        await bulk.write([good, write])
    assert await bulk.states_after(None, 10) == []


async def test_a_session_twice_in_one_batch_is_refused(store: SessionStore) -> None:
    """One batch names each session once, so its order within the batch is unambiguous."""
    record = SessionRecord("s", T0, T0)
    with pytest.raises(ValueError, match="appears twice"):
        await bulk_for(store).write([SessionWrite(record), SessionWrite(record)])


async def test_keyset_walk_visits_every_session_once(store: SessionStore) -> None:
    """states_after pages through all sessions in id order, without repeats."""
    bulk = bulk_for(store)
    await bulk.write([SessionWrite(SessionRecord(f"s{i:02}", T0, T0)) for i in range(7)])
    seen: list[str] = []
    after = None
    while page := await bulk.states_after(after, 3):
        seen += [s.record.session_id for s in page]
        after = page[-1].record.session_id
    assert seen == [f"s{i:02}" for i in range(7)]
