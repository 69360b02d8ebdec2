"""The resumable writer behind copy and import: prefixes are finished, never duplicated."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator, Sequence

import pytest

from agents_memory import SessionStore
from agents_memory._admin._errors import ConflictError
from agents_memory._admin._transfer import SourceSession, TransferResult, transfer
from agents_memory._sqlalchemy._bulk import (
    Bulk,
    ItemRecord,
    SessionRecord,
    SessionState,
    SessionWrite,
    bulk_for,
)

T0 = dt.datetime.fromisoformat("2024-05-01 09:30:00")


def record(sid: str, *, meta: dict[str, object] | None = None) -> SessionRecord:
    return SessionRecord(sid, T0, T0 + dt.timedelta(hours=1), meta)  # type: ignore[arg-type]


def items(sid: str, n: int) -> list[ItemRecord]:
    return [ItemRecord({"sid": sid, "n": i}, T0 + dt.timedelta(seconds=i)) for i in range(n)]


def source(sessions: dict[str, list[ItemRecord]], *, known: bool = True) -> list[SourceSession]:
    """Sources as a store gives them (counts known) or as a file does (``known=False``)."""

    def stream(entries: list[ItemRecord]):
        async def gen() -> AsyncIterator[ItemRecord]:
            for entry in entries:
                yield entry

        return gen

    return [
        SourceSession(
            record(sid),
            len(entries) if known else None,
            (entries[-1] if entries else None) if known else None,
            stream(entries),
        )
        for sid, entries in sessions.items()
    ]


async def pages(page: list[SourceSession]) -> AsyncIterator[list[SourceSession]]:
    yield page


async def stored(store: SessionStore) -> dict[str, list[ItemRecord]]:
    bulk = bulk_for(store)
    return {
        s.record.session_id: [r async for r in bulk.rows(s.record.session_id, batch_size=100)]
        for s in await bulk.states_after(None, 100)
    }


@pytest.mark.parametrize("known", [True, False], ids=["store", "file"])
async def test_fresh_target_gets_everything(store: SessionStore, known: bool) -> None:
    """Every session and item is written, batches spanning sessions, empty ones included."""
    data = {"a": items("a", 7), "b": items("b", 0), "c": items("c", 3)}
    result = await transfer(pages(source(data, known=known)), bulk_for(store), batch_size=4)
    assert result == TransferResult(3, 3, 0, 10, 0)
    assert await stored(store) == data


@pytest.mark.parametrize("known", [True, False], ids=["store", "file"])
async def test_resume_finishes_partial_sessions(store: SessionStore, known: bool) -> None:
    """A target holding a prefix of each session gets only the rest; complete ones are left."""
    data = {"a": items("a", 6), "b": items("b", 4), "c": items("c", 2)}
    bulk = bulk_for(store)
    await bulk.write(
        [
            SessionWrite(record("a"), data["a"][:6]),  # complete
            SessionWrite(record("b"), data["b"][:1]),  # partial
        ]
    )
    result = await transfer(pages(source(data, known=known)), bulk, batch_size=2)
    assert await stored(store) == data
    assert result.items_written == 3 + 2
    assert result.items_present == 6 + 1
    assert result.sessions_unchanged == 1


async def test_resume_refreshes_a_changed_session_row(store: SessionStore) -> None:
    """Same items but newer metadata: only the session row is rewritten."""
    data = {"a": items("a", 2)}
    bulk = bulk_for(store)
    await bulk.write([SessionWrite(SessionRecord("a", T0, T0), data["a"])])
    result = await transfer(pages(source(data)), bulk, batch_size=10)
    assert (result.sessions_written, result.items_written) == (1, 0)
    assert (await bulk.states_of(["a"]))["a"].record == record("a")


@pytest.mark.parametrize("known", [True, False], ids=["store", "file"])
async def test_a_different_session_is_a_conflict(store: SessionStore, known: bool) -> None:
    """A target session that is not a prefix of the source stops the run and is left alone."""
    data = {"a": items("a", 3), "b": items("b", 3)}
    await store.session("b").add_items([{"someone": "else"}])
    with pytest.raises(ConflictError, match=r"'b'.*--if-exists replace"):
        await transfer(pages(source(data, known=known)), bulk_for(store), batch_size=100)
    after = await stored(store)
    assert after["a"] == data["a"]  # the work before the conflict is kept
    assert [r.item for r in after["b"]] == [{"someone": "else"}]


async def test_a_longer_target_session_is_a_conflict(store: SessionStore) -> None:
    """A target holding more items than the source is not a partial copy either."""
    data = {"a": items("a", 2)}
    await bulk_for(store).write([SessionWrite(record("a"), items("a", 3))])
    with pytest.raises(ConflictError, match="holds 3 items where the source has only 2"):
        await transfer(pages(source(data, known=False)), bulk_for(store), batch_size=100)


async def test_skip_replace_append(store: SessionStore) -> None:
    """Skip keeps the target's session, replace rewrites it, append adds after it."""
    bulk = bulk_for(store)
    mine = [ItemRecord({"mine": 1}, T0)]
    data = {"a": items("a", 2)}
    await bulk.write([SessionWrite(record("a"), mine)])
    await transfer(pages(source(data)), bulk, batch_size=10, if_exists="skip")
    assert (await stored(store))["a"] == mine
    await transfer(pages(source(data)), bulk, batch_size=10, if_exists="append")
    assert (await stored(store))["a"] == mine + data["a"]
    await transfer(pages(source(data)), bulk, batch_size=10, if_exists="replace")
    assert (await stored(store))["a"] == data["a"]


async def test_bad_options_are_refused(store: SessionStore) -> None:
    """A batch size below 1 or an unknown mode is a ValueError before anything runs."""
    with pytest.raises(ValueError, match="batch size"):
        await transfer(pages([]), bulk_for(store), batch_size=0)
    with pytest.raises(ValueError, match="if_exists"):
        await transfer(pages([]), bulk_for(store), batch_size=1, if_exists="merge")  # type: ignore[arg-type]


class ReadsTogether:
    """A target whose first ``states_of`` returns only once the other run has read as well.

    Both runs then see the target before either writes: the race the test is about happens
    every time, not only when the scheduler happens to interleave them (under load it did
    not). Everything else goes to the real target.
    """

    def __init__(self, bulk: Bulk, barrier: asyncio.Barrier) -> None:
        self._bulk = bulk
        self._barrier = barrier
        self.first_read: dict[str, SessionState] | None = None

    def __getattr__(self, name: str) -> object:
        return getattr(self._bulk, name)

    async def states_of(self, session_ids: Sequence[str]) -> dict[str, SessionState]:
        """The real states; the first time, after the other run has read its own too."""
        states = await self._bulk.states_of(session_ids)
        if self.first_read is None:
            self.first_read = states
            await asyncio.wait_for(self._barrier.wait(), timeout=60)
        return states


async def test_overlapping_transfers_never_duplicate(file_backend, names) -> None:
    """Two runs into one target that read it before either wrote: one stops, none duplicates."""
    from agents_memory._sqlalchemy._bulk import ConcurrentWriteError  # noqa: PLC0415

    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    data = {"a": items("a", 35), "b": items("b", 20), "c": items("c", 5)}
    first = SessionStore.from_url(file_backend.url, create_tables=True, **kw)
    second = SessionStore.from_url(file_backend.url, **kw)
    try:
        await first.stats()  # the schema, before both runs start
        barrier = asyncio.Barrier(2)
        targets = [
            ReadsTogether(bulk_for(first), barrier),
            ReadsTogether(bulk_for(second), barrier),
        ]
        outcomes = await asyncio.gather(
            *(transfer(pages(source(data)), target, batch_size=10) for target in targets),  # type: ignore[arg-type]
            return_exceptions=True,
        )
        assert [t.first_read for t in targets] == [{}, {}]  # both read an empty target
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        assert all(isinstance(o, ConcurrentWriteError) for o in failed), failed
        assert failed, "both runs read an empty target first; the second writer must stop"
        assert "another copy or import" in str(failed[0])
        assert all(len(v) <= len(data[k]) for k, v in (await stored(first)).items())
        # a re-run finishes the job, still without duplicating anything
        await transfer(pages(source(data)), bulk_for(second), batch_size=10)
        assert await stored(first) == data
    finally:
        await first.close()
        await second.close()
