"""Retention on every database: each option of prune(), expiry, listings, concurrency, kill -9."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import bindparam, select, update

from agents_memory import PruneReport, SessionStore, get_models
from agents_memory._codec import encode_items
from agents_memory._sqlalchemy._store import backend_of
from agents_memory._sqlalchemy._timestamps import utcnow

CHILD = Path(__file__).with_name("_prune_child.py")
AGE = dt.timedelta(days=1)
"""The policy's age; stale sessions are dated in the past (``backdate``), never waited for."""
PAST = dt.datetime(2020, 1, 1)  # noqa: DTZ001 - the store keeps naive UTC


async def backdate(store: SessionStore, *sids: str, column: str = "updated_at") -> None:
    """Set ``column`` of the sessions ``sids`` to 2020, behind the library's back.

    ``updated_at``: last written long ago (``older_than`` selects them); ``expires_at``:
    a deadline that has passed. No test depends on how long anything takes.
    """
    backend = backend_of(store)
    s = backend.st.sessions
    kind = backend.db.stamp_type(s.c[column].type)
    statement = (
        update(s).where(s.c.session_id.in_(sids)).values({column: bindparam("at", type_=kind)})
    )
    async with store.engine.begin() as conn:
        await conn.execute(statement, {"at": backend.db.stamp(PAST)})


async def fill(store: SessionStore, sid: str, n: int, **meta: Any) -> None:
    """``n`` items ``{"i": 0..n-1}``, in a few appends; metadata if given."""
    s = store.session(sid)
    if meta:
        await s.set_metadata(meta)
    for start in range(0, n, 500):
        await s.add_items([{"i": i} for i in range(start, min(n, start + 500))])


async def indexes(store: SessionStore, sid: str) -> list[int]:
    return [item["i"] for item in await store.session(sid).get_items()]


async def ids(store: SessionStore, **kw: Any) -> set[str]:
    return {i.session_id for i in (await store.list_sessions(limit=1000, **kw)).sessions}


async def old_and_new(store: SessionStore) -> None:
    """Sessions ``old-*`` last written in 2020 and ``new-*`` just now."""
    await fill(store, "old-a", 5, team="x")
    await fill(store, "old-b", 1200, team="y")  # more than one batch: deleted in steps
    await backdate(store, "old-a", "old-b")
    await fill(store, "new-a", 30, team="x")
    await fill(store, "new-b", 2, team="y")


async def test_older_than_deletes_only_stale_sessions(store: SessionStore) -> None:
    """Sessions not written to for ``older_than`` go whole; the others are untouched."""
    await old_and_new(store)
    preview = await store.prune(older_than=AGE, dry_run=True)
    assert preview == PruneReport(2, 0, 1205, preview.bytes_freed, dry_run=True)
    assert preview.bytes_freed is not None
    assert preview.bytes_freed >= 1205 * len('{"i":0}')
    assert await ids(store) == {"old-a", "old-b", "new-a", "new-b"}  # dry run deleted nothing
    report = await store.prune(older_than=AGE)
    assert report == PruneReport(2, 0, 1205, preview.bytes_freed, dry_run=False)
    assert await ids(store) == {"new-a", "new-b"}
    assert await indexes(store, "new-a") == list(range(30))
    assert await store.prune(older_than=AGE) == PruneReport(0, 0, 0, 0, dry_run=False)


async def test_keep_last_trims_to_the_newest(store: SessionStore) -> None:
    """keep_last=N leaves each session its newest N items; shorter sessions are untouched."""
    await fill(store, "long", 2500)
    await fill(store, "short", 3)
    await fill(store, "edge", 10)
    preview = await store.prune(keep_last=10, dry_run=True)
    assert (preview.sessions_trimmed, preview.items_deleted) == (1, 2490)
    assert await indexes(store, "long") == list(range(2500))
    report = await store.prune(keep_last=10)
    assert report == dataclass_replace(preview, dry_run=False)
    assert await indexes(store, "long") == list(range(2490, 2500))
    assert await indexes(store, "short") == [0, 1, 2]
    assert await indexes(store, "edge") == list(range(10))
    again = await store.prune(keep_last=0)
    assert (again.sessions_trimmed, again.items_deleted, again.sessions_deleted) == (3, 23, 0)
    assert await indexes(store, "long") == []
    assert await ids(store) == {"long", "short", "edge"}  # emptied, not deleted


def dataclass_replace(report: PruneReport, **changes: Any) -> PruneReport:
    import dataclasses  # noqa: PLC0415

    return dataclasses.replace(report, **changes)


async def test_both_options_and_metadata(store: SessionStore) -> None:
    """older_than and keep_last together; a metadata filter limits both."""
    await old_and_new(store)
    report = await store.prune(older_than=AGE, keep_last=4, metadata={"team": "x"})
    # old-a (team x) deleted; new-a (team x) trimmed 30 -> 4; team y untouched
    assert report == PruneReport(1, 1, 5 + 26, report.bytes_freed, dry_run=False)
    assert await ids(store) == {"old-b", "new-a", "new-b"}
    assert await indexes(store, "new-a") == list(range(26, 30))
    assert len(await indexes(store, "old-b")) == 1200
    both = await store.prune(older_than=AGE, keep_last=1)
    # a dry run of the same would have counted old-b as deleted, not trimmed
    assert both == PruneReport(1, 2, 1200 + 3 + 1, both.bytes_freed, dry_run=False)
    assert await indexes(store, "new-b") == [1]


async def test_bad_policies_are_refused(store: SessionStore) -> None:
    """Typed errors before anything is read or deleted."""
    await fill(store, "a", 3)
    for kwargs in (
        {"older_than": dt.timedelta(0)},
        {"older_than": 30},
        {"keep_last": -1},
        {"keep_last": True},
        {"metadata": {}},
    ):
        with pytest.raises(ValueError):  # noqa: PT011 - the messages differ per option
            await store.prune(**kwargs)
    with pytest.raises(TypeError):
        await store.prune(dry_run="yes")  # type: ignore[arg-type]
    assert await indexes(store, "a") == [0, 1, 2]


async def test_expired_sessions_are_hidden_then_pruned(store: SessionStore) -> None:
    """set_ttl: the session leaves listings at its deadline and the next prune deletes it."""
    await fill(store, "brief", 3)
    await fill(store, "kept", 3)
    brief = store.session("brief")
    assert await brief.expires_at() is None
    await brief.set_ttl(dt.timedelta(hours=1))
    deadline = await brief.expires_at()
    assert deadline is not None
    assert dt.timedelta(0) < deadline - utcnow() <= dt.timedelta(hours=1)
    assert await ids(store) == {"brief", "kept"}
    assert await store.prune() == PruneReport(0, 0, 0, 0, dry_run=False)
    await backdate(store, "brief", column="expires_at")  # the deadline has passed
    assert await ids(store) == {"kept"}
    assert await store.get_session("brief") is None
    size = sum(map(len, encode_items([{"i": i} for i in range(3)])))  # 21 (24 marked)
    assert await store.prune(dry_run=True) == PruneReport(1, 0, 3, size, dry_run=True)
    assert await store.prune() == PruneReport(1, 0, 3, size, dry_run=False)
    assert await store.session("brief").get_items() == []
    await store.session("kept").set_ttl(dt.timedelta(hours=1))
    await store.session("kept").set_ttl(None)
    assert await store.session("kept").expires_at() is None
    with pytest.raises(ValueError, match="ttl"):
        await store.session("kept").set_ttl(dt.timedelta(seconds=-1))


async def test_list_sessions_updated_before_and_oldest_first(store: SessionStore) -> None:
    """What a policy would touch, oldest first, paged by keyset with its own cursor."""
    for n in range(5):
        await fill(store, f"s{n}", 1)
    stamp = (await store.get_session("s3")).updated_at  # type: ignore[union-attr]
    page = await store.list_sessions(order="oldest", limit=2)
    assert [i.session_id for i in page.sessions] == ["s0", "s1"]
    assert page.next_cursor is not None
    nxt = await store.list_sessions(order="oldest", limit=2, cursor=page.next_cursor)
    assert [i.session_id for i in nxt.sessions] == ["s2", "s3"]
    with pytest.raises(ValueError, match="order='oldest'"):
        await store.list_sessions(limit=2, cursor=page.next_cursor)
    before = await store.list_sessions(updated_before=stamp)
    assert [i.session_id for i in before.sessions] == ["s2", "s1", "s0"]
    aware = stamp.replace(tzinfo=dt.UTC).astimezone(dt.timezone(dt.timedelta(hours=5)))
    assert await ids(store, updated_before=aware) == {"s0", "s1", "s2"}
    with pytest.raises(ValueError, match="order"):
        await store.list_sessions(order="sideways")  # type: ignore[arg-type]


async def test_trim_keeps_items_appended_while_it_runs(store: SessionStore) -> None:
    """A trim deletes only what was older than the newest N when it started, in batches."""
    await fill(store, "live", 4000)
    appended: list[int] = []
    during: list[int] = []
    running = asyncio.Event()
    done = False

    async def appender() -> None:
        n = 0
        await running.wait()
        while not done:
            await store.session("live").add_items([{"i": 4000 + n}])
            appended.append(4000 + n)
            during.append(n)
            n += 1
            await asyncio.sleep(0)

    async def trim() -> PruneReport:
        running.set()
        try:
            return await store.prune(keep_last=50)
        finally:
            nonlocal done
            done = True

    task = asyncio.create_task(appender())
    report = await trim()
    await task
    assert during, "the appender never ran while the trim did"
    remaining = await indexes(store, "live")
    # a contiguous newest suffix holding at least the newest 50 at the start and every append
    assert remaining == list(range(remaining[0], 4000 + len(appended)))
    # the cut-off is read when the trim starts: appends before it count among the newest 50
    assert 3950 <= remaining[0] <= 3950 + len(appended)
    assert report.items_deleted == remaining[0]
    assert report.sessions_trimmed == 1


async def test_stale_session_written_during_prune_is_kept(store: SessionStore) -> None:
    """A session selected as stale but written to before its delete survives whole."""
    for n in range(250):  # several pages of sessions
        await fill(store, f"s{n:03}", 2)
    await backdate(store, *(f"s{n:03}" for n in range(250)))
    written: list[str] = []
    start = asyncio.Event()

    async def writer() -> None:
        await start.wait()
        for n in range(249, -1, -10):  # newest pages last: the prune reaches them later
            await store.session(f"s{n:03}").add_items([{"i": 2}])
            written.append(f"s{n:03}")
            await asyncio.sleep(0)

    async def run() -> PruneReport:
        start.set()
        return await store.prune(older_than=AGE)

    report, _ = await asyncio.gather(run(), writer())
    left = await ids(store)
    assert left <= set(written)
    kept = {sid for sid in left if await indexes(store, sid) == [0, 1, 2]}
    # the others were written to after their deletion: a new session holding just that item
    for sid in left - kept:
        assert await indexes(store, sid) == [2], sid
    assert report.sessions_deleted + len(kept) == 250
    assert kept, "no write reached a stale session before the prune did (no race happened)"


async def test_two_prunes_at_once_reach_the_same_end(store: SessionStore) -> None:
    """Two concurrent prunes: no error, the end state of one, each item counted once."""
    for n in range(30):
        await fill(store, f"s{n}", 1500 if n % 10 == 0 else 40)
    await backdate(store, *(f"s{n}" for n in range(30)))
    for n in range(30, 40):
        await fill(store, f"s{n}", 60)
    other = SessionStore(
        store.engine,
        sessions_table=store.table_names.sessions,
        messages_table=store.table_names.messages,
    )
    a, b = await asyncio.gather(
        store.prune(older_than=AGE, keep_last=5), other.prune(older_than=AGE, keep_last=5)
    )
    assert a.sessions_deleted + b.sessions_deleted == 30
    assert a.items_deleted + b.items_deleted == 3 * 1500 + 27 * 40 + 10 * 55
    assert await ids(store) == {f"s{n}" for n in range(30, 40)}
    for n in range(30, 40):
        assert await indexes(store, f"s{n}") == list(range(55, 60))


async def test_sigkill_at_any_moment_leaves_whole_or_suffix(
    file_backend: Any, store: SessionStore
) -> None:
    """Kill -9 a pruning process at random moments, many times: never a hole in a session."""
    names = store.table_names
    sizes: dict[str, int] = {}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    kills = 0
    for run in range(6):
        for n in range(6):
            sid = f"r{run}-{n}"
            sizes[sid] = 1500 if n % 3 == 0 else 300
            await fill(store, sid, sizes[sid], stale=n % 2 == 0)
        child = subprocess.Popen(  # noqa: S603, ASYNC220 - our own script, started once per run
            [sys.executable, str(CHILD), file_backend.url, names.sessions, names.messages],
            stdout=subprocess.PIPE,
            env=env,
        )
        assert child.stdout is not None
        line = await asyncio.to_thread(child.stdout.readline)
        assert line.strip() == b"pruning", line
        await asyncio.sleep(random.uniform(0.0, 0.5))
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            kills += 1
        await asyncio.to_thread(child.wait, 30)
        for sid, size in sizes.items():
            got = await indexes(store, sid)
            assert got == list(range(size - len(got), size)), f"hole in {sid} after run {run}"
            if not got and await store.get_session(sid) is not None:
                pytest.fail(f"{sid} has no items but still exists")
    assert kills >= 3, "the child finished before it was killed too often to prove anything"


async def test_deleting_an_advanced_session_deletes_its_branch_names(store: SessionStore) -> None:
    """A session pruned whole loses its used branch names; one kept keeps them (rev. 0005)."""
    table = get_models(store.table_names).Branch.__table__

    async def names_of(sid: str) -> set[str]:
        async with store.engine.connect() as conn:
            query = select(table.c.branch_id).where(table.c.session_id == sid)
            return set((await conn.execute(query)).scalars())

    for sid in ("old", "young"):
        s = store.advanced_session(sid)
        await s.add_items([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
        await s.create_branch_from_turn(2, "alt")
    await backdate(store, "old")
    report = await store.prune(older_than=AGE)
    assert report.sessions_deleted == 1
    assert await names_of("old") == set()
    assert await names_of("young") == {"alt"}


async def test_deleting_an_advanced_session_deletes_its_clear_generation(
    store: SessionStore,
) -> None:
    """A session pruned whole loses its clear generation; one kept keeps it (rev. 0007)."""
    table = get_models(store.table_names).ClearGeneration.__table__

    async def generations() -> dict[str, int]:
        async with store.engine.connect() as conn:
            rows = (await conn.execute(select(table.c.session_id, table.c.generation))).all()
            return {str(sid): int(n) for sid, n in rows}

    for sid in ("old", "young"):
        s = store.advanced_session(sid)
        await s.add_items([{"role": "user", "content": "a"}])
        await s.clear_session()
        await s.add_items([{"role": "user", "content": "b"}])
    assert await generations() == {"old": 1, "young": 1}
    await backdate(store, "old")
    report = await store.prune(older_than=AGE)
    assert report.sessions_deleted == 1
    assert await generations() == {"young": 1}
