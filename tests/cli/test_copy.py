"""``agents-memory copy``: SQLite to Postgres (or another file), exact, resumable after a kill."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.exc import DBAPIError

from agents_memory import SessionStore, create_engine
from agents_memory._sqlalchemy._bulk import ItemRecord, SessionRecord, bulk_for
from agents_memory.models import get_models

BIN = Path(sys.executable).parent / "agents-memory"
SESSIONS, ITEMS = 200, 50  # the size of the sqlite_source fixture (checked below)


async def snapshot(url: str, names) -> list[tuple[SessionRecord, list[ItemRecord]]]:
    """Every session row and every item with its time, in order."""
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    async with SessionStore.from_url(url, **kw) as store:
        bulk = bulk_for(store)
        out = []
        after = None
        while page := await bulk.states_after(after, 100):
            for state in page:
                sid = state.record.session_id
                out.append((state.record, [r async for r in bulk.rows(sid, batch_size=500)]))
            after = page[-1].record.session_id
        return out


async def count_items(engine, names) -> int:
    messages = get_models(names).Message.__table__
    try:
        async with engine.connect() as conn:
            return int((await conn.execute(select(func.count()).select_from(messages))).scalar())
    except DBAPIError:  # the copy has not created the tables yet
        return 0


async def test_copy_sqlite_to_target_is_exact(cli, sqlite_source: str) -> None:
    """200 sessions x 50 items arrive with the same rows, items, order and times; re-run: no-op."""
    source = sqlite_source
    result = await cli.json("copy", "--from", source, "--to", cli.url, "--batch", "1000")
    assert result == {
        "sessions": SESSIONS,
        "sessions_written": SESSIONS,
        "sessions_unchanged": 0,
        "items_written": SESSIONS * ITEMS,
        "items_present": 0,
        "advanced_sessions": 0,
        "advanced_skipped": 0,
        "advanced_cleared": 0,
    }
    expected = await snapshot(source, cli.names)
    assert len(expected) == SESSIONS
    assert sum(len(items) for _, items in expected) == SESSIONS * ITEMS
    assert await snapshot(cli.url, cli.names) == expected
    again = await cli.json("copy", "--from", source, "--to", cli.url)
    assert (again["items_written"], again["sessions_unchanged"]) == (0, SESSIONS)
    text = await cli("copy", "--from", source, "--to", cli.url)
    assert text.stdout.startswith("copied 0 sessions (0 items) from ")
    assert f"; {SESSIONS} sessions and {SESSIONS * ITEMS} items were already there" in text.stdout


async def test_killed_copy_resumes_without_duplicates(cli, sqlite_source: str) -> None:
    """A copy killed (SIGKILL) mid-way is finished by running it again, with nothing duplicated."""
    source = sqlite_source
    args = ["--sessions-table", cli.names.sessions, "--messages-table", cli.names.messages]
    proc = await asyncio.create_subprocess_exec(
        BIN,
        *args,
        *["copy", "--from", source, "--to", cli.url, "--batch", "20"],
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    engine = create_engine(cli.url)
    try:
        # Poll the target from outside, as an operator would, and kill at about a fifth.
        while proc.returncode is None and await count_items(engine, cli.names) < SESSIONS * 10:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(proc.wait(), timeout=60)
        assert proc.returncode == -signal.SIGKILL, "the copy finished before it could be killed"
        # A COMMIT the killed process sent just before dying still completes on the server:
        # count once the total holds still.
        copied = -1
        while (now := await count_items(engine, cli.names)) != copied:
            copied = now
            await asyncio.sleep(0.3)
    finally:
        await engine.dispose()
    assert 0 < copied < SESSIONS * ITEMS

    result = await cli.json("copy", "--from", source, "--to", cli.url, "--batch", "20")
    assert result["items_present"] == copied
    assert result["items_written"] == SESSIONS * ITEMS - copied
    assert await snapshot(cli.url, cli.names) == await snapshot(source, cli.names)


async def test_copy_refuses_the_same_store(cli, store) -> None:
    """Copying a store onto itself is an error, not a no-op that looks like success."""
    result = await cli("copy", "--to", cli.url, code=1)
    assert "the same store" in result.stderr


async def test_copy_stops_on_a_diverged_session(cli, store, sqlite_source: str) -> None:
    """A target session with other items is a conflict (exit 1) that names the way out."""
    source = sqlite_source
    await store.session("session-005").add_items([{"role": "user", "content": "mine"}])
    result = await cli("copy", "--from", source, "--to", cli.url, code=1)
    assert "session 'session-005' already exists in the target" in result.stderr
    assert "--if-exists" in result.stderr
    assert await store.session("session-005").get_items() == [{"role": "user", "content": "mine"}]
    replaced = await cli.json("copy", "--from", source, "--to", cli.url, "--if-exists", "replace")
    assert replaced["items_written"] == SESSIONS * ITEMS
    assert await snapshot(cli.url, cli.names) == await snapshot(source, cli.names)


@pytest.mark.parametrize("password", ["hunter2", "p@ss:w/rd"])
async def test_copy_masks_passwords(cli, store, password: str) -> None:
    """A failing copy to a server with a password never prints the password."""
    from urllib.parse import quote_plus  # noqa: PLC0415

    url = f"postgresql://app:{quote_plus(password)}@127.0.0.1:9/x"
    result = await cli("copy", "--to", url, code=1)
    assert password not in result.output
    assert quote_plus(password) not in result.output


def _running(procs: list[asyncio.subprocess.Process]) -> bool:
    """Whether none of ``procs`` has ended."""
    return all(proc.returncode is None for proc in procs)


async def _grew_while_stopped(
    procs: list[asyncio.subprocess.Process], engine, names, batch: int
) -> bool:
    """Stop the first copy just after a batch lands; whether the other then writes meanwhile.

    The first is stopped (SIGSTOP) as soon as the target's item count moves, so it is
    mid-copy. The other must then add more than two batches within two seconds (the
    first can have one COMMIT in flight when the signal lands). If the stop caught the
    first inside a transaction, the other may wait for its locks instead: the first is
    let go either way, and ``False`` asks for another try.
    """
    first = procs[0]
    seen = await count_items(engine, names)
    while _running(procs):
        if (stopped_at := await count_items(engine, names)) == seen:
            continue
        first.send_signal(signal.SIGSTOP)
        try:
            deadline = asyncio.get_running_loop().time() + 2
            while True:
                last = not _running(procs[1:]) or asyncio.get_running_loop().time() > deadline
                if await count_items(engine, names) > stopped_at + 2 * batch:
                    return True
                if last:  # counted once more after the other ended or time ran out
                    return False
                await asyncio.sleep(0.01)
        finally:
            first.send_signal(signal.SIGCONT)
    return False


async def test_overlapping_copies_never_duplicate(cli, sqlite_source: str) -> None:
    """Two `copy` processes into one target at once: each ends cleanly, nothing is duplicated.

    The overlap is shown, not assumed: either one run finds the target moved under it
    (only the other run can have moved it) and says so, or the second writes while the
    first is stopped mid-copy (``_grew_while_stopped``, tried until the runs end).
    """
    source = sqlite_source
    batch = 20
    args = ["--sessions-table", cli.names.sessions, "--messages-table", cli.names.messages]
    copy = [*args, "copy", "--from", source, "--to", cli.url, "--batch", str(batch)]
    await cli("db", "upgrade")  # both runs start on a migrated target
    pipe = asyncio.subprocess.PIPE
    procs = [
        await asyncio.create_subprocess_exec(BIN, *copy, stdout=pipe, stderr=pipe) for _ in range(2)
    ]
    engine = create_engine(cli.url)
    try:
        grew = False
        while not grew and _running(procs):
            grew = await _grew_while_stopped(procs, engine, cli.names, batch)
        outputs = [await asyncio.wait_for(p.communicate(), timeout=240) for p in procs]
        for proc, (_out, errors) in zip(procs, outputs, strict=True):
            assert proc.returncode == 0 or (
                proc.returncode == 1 and b"another copy or import is writing" in errors
            ), errors.decode()
        assert grew or any(proc.returncode == 1 for proc in procs), (
            "no overlap shown: neither run was refused, and the second never wrote while the "
            "first was stopped"
        )
        assert await count_items(engine, cli.names) <= SESSIONS * ITEMS
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                await proc.wait()
        await engine.dispose()
    await cli("copy", "--from", source, "--to", cli.url)  # finishes whatever stopped
    assert await snapshot(cli.url, cli.names) == await snapshot(source, cli.names)


async def test_copy_into_other_table_names(cli, store, sqlite_source: str) -> None:
    """--to-sessions-table/--to-messages-table: the target's own names, even in one database."""
    from sqlalchemy import MetaData, Table  # noqa: PLC0415
    from sqlalchemy.schema import DropTable  # noqa: PLC0415

    from agents_memory import TableNames  # noqa: PLC0415

    await store.stats()  # the source's names exist in the target database too
    other = TableNames(f"{cli.names.sessions}_to", f"{cli.names.messages}_to")
    to = ["--to-sessions-table", other.sessions, "--to-messages-table", other.messages]
    try:
        result = await cli.json("copy", "--from", sqlite_source, "--to", cli.url, *to)
        assert result["items_written"] == SESSIONS * ITEMS
        assert await snapshot(cli.url, other) == await snapshot(sqlite_source, cli.names)
        assert await snapshot(cli.url, cli.names) == []  # the source's names were left alone
        # the same database with the same names is still refused
        same = await cli("copy", "--to", cli.url, "--to-sessions-table", cli.names.sessions, code=1)
        assert "the same store" in same.stderr
        bad = await cli("copy", "--to", cli.url, "--to-messages-table", "x" * 300, code=2)
        assert "--to-sessions-table" in bad.stderr or "--to-messages-table" in bad.stderr
    finally:
        engine = create_engine(cli.url)
        try:
            async with engine.begin() as conn:
                for table in (*reversed(other.tables), other.version_table):
                    await conn.execute(DropTable(Table(table, MetaData()), if_exists=True))
        finally:
            await engine.dispose()


async def test_copy_of_an_item_past_max_allowed_packet(cli, file_backend, tmp_path: Path) -> None:
    """MariaDB target: add_items' ValueError naming max_allowed_packet; nothing written."""
    if file_backend.kind != "mysql":
        pytest.skip("max_allowed_packet is MySQL/MariaDB's limit")
    from sqlalchemy import text  # noqa: PLC0415

    engine = create_engine(cli.url)
    try:
        async with engine.connect() as conn:
            limit = int((await conn.execute(text("SELECT @@max_allowed_packet"))).scalar_one())
    finally:
        await engine.dispose()
    source = f"sqlite+aiosqlite:///{tmp_path / 'big.db'}"
    kw = {"sessions_table": cli.names.sessions, "messages_table": cli.names.messages}
    async with SessionStore.from_url(source, create_tables=True, **kw) as store:
        await store.session("small").add_items([{"content": "ok"}])
        await store.session("zbig").add_items([{"content": "x" * (limit + 1000)}])
    result = await cli("copy", "--from", source, "--to", cli.url, "--batch", "10", code=1)
    assert "session 'zbig'" in result.stderr
    assert "max_allowed_packet" in result.stderr
    assert "lost the connection" not in result.stderr
    async with SessionStore.from_url(cli.url, **kw) as target:
        assert await target.session("zbig").get_items() == []


async def test_copy_carries_advanced_sessions(cli, tmp_path: Path) -> None:
    """Branches, turns, usage and used names cross with the items; a re-run adds nothing."""
    from advanced_items import advanced_counts, advanced_view, branched, user  # noqa: PLC0415

    from agents_memory import migrations  # noqa: PLC0415

    url = f"sqlite+aiosqlite:///{tmp_path / 'adv.db'}"
    kw = {"sessions_table": cli.names.sessions, "messages_table": cli.names.messages}
    await migrations.upgrade(url, **kw)
    async with SessionStore.from_url(url, **kw) as store:
        await store.session("plain").add_items([{"role": "user", "content": "plain"}])
        await branched(store.advanced_session("adv"))
    expected = await advanced_view(url, cli.names, "adv")
    assert expected["branches"] == ["main", "alt"]

    result = await cli.json("copy", "--from", url, "--to", cli.url)
    assert (result["advanced_sessions"], result["advanced_skipped"]) == (1, 0)
    assert await advanced_view(cli.url, cli.names, "adv") == expected
    first = await advanced_counts(cli.url, cli.names)
    again = await cli.json("copy", "--from", url, "--to", cli.url)
    assert again["items_written"] == 0
    assert await advanced_counts(cli.url, cli.names) == first
    assert await advanced_view(cli.url, cli.names, "adv") == expected
    async with SessionStore.from_url(cli.url, **kw) as target:
        t = target.advanced_session("adv")
        await t.add_items([user("more")])
        for used in ("alt", "gone"):
            with pytest.raises(ValueError, match="already been used"):
                await t.create_branch_from_turn(1, used)
        assert await target.session("plain").get_items() == [{"role": "user", "content": "plain"}]
    # append keeps the target's own items: the advanced rows are left as they are
    appended = await cli.json("copy", "--from", url, "--to", cli.url, "--if-exists", "append")
    assert (appended["advanced_sessions"], appended["advanced_skipped"]) == (0, 0)
