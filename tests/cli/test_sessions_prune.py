"""``agents-memory sessions prune`` and the retention options of ``sessions list``."""

from __future__ import annotations

import datetime as dt

from agents_memory import SessionStore
from agents_memory._sqlalchemy._bulk import ItemRecord, SessionRecord, SessionWrite, bulk_for

T0 = dt.datetime.fromisoformat("2024-06-01 08:00:00")


async def seed(store: SessionStore) -> None:
    """Three sessions last written in 2024 (``old0..2``, 10 items) and two written now."""
    writes = []
    for i in range(3):
        at = T0 + dt.timedelta(minutes=i)
        items = [ItemRecord({"role": "user", "content": f"q{i}.{k}"}, at) for k in range(10)]
        meta = {"plan": "free" if i else "paid"}
        writes.append(SessionWrite(SessionRecord(f"old{i}", at, at, meta), items))
    await bulk_for(store).write(writes)
    for name in ("new0", "new1"):
        await store.session(name).add_items([{"role": "user", "content": str(k)} for k in range(8)])


async def test_dry_run_then_prune(cli, store) -> None:
    """A dry run counts and deletes nothing; the real run deletes the same; JSON has the report."""
    await seed(store)
    preview = await cli.json(
        "sessions", "prune", "--older-than", "30d", "--keep-last", "3", "--dry-run"
    )
    assert {k: v for k, v in preview.items() if k != "bytes_freed"} == {
        "sessions_deleted": 3,
        "sessions_trimmed": 2,
        "items_deleted": 30 + 2 * 5,
        "dry_run": True,
    }
    assert len((await store.list_sessions()).sessions) == 5
    text = await cli("sessions", "prune", "--older-than", "30d", "--keep-last", "3", "--yes")
    assert "deleted 3 sessions and 40 items" in text.stdout
    assert "trimmed 2 sessions" in text.stdout
    assert {i.session_id for i in (await store.list_sessions()).sessions} == {"new0", "new1"}
    assert [i["content"] for i in await store.session("new0").get_items()] == ["5", "6", "7"]


async def test_asks_first_and_filters_by_metadata(cli, store) -> None:
    """Without --yes it asks (no: nothing deleted); -m limits the policy to matching sessions."""
    await seed(store)
    refused = await cli("sessions", "prune", "--older-than", "30d", input="n\n", code=1)
    assert "not updated for 30d" in refused.stdout
    assert len((await store.list_sessions()).sessions) == 5
    done = await cli.json("sessions", "prune", "--older-than", "30d", "-m", "plan=free", "--yes")
    assert (done["sessions_deleted"], done["items_deleted"]) == (2, 20)
    left = {i.session_id for i in (await store.list_sessions()).sessions}
    assert left == {"old0", "new0", "new1"}


async def test_bad_duration_says_how(cli, store) -> None:
    """A duration without a unit is refused with the accepted forms."""
    await seed(store)
    bad = await cli("sessions", "prune", "--older-than", "30", "--yes", code=2)
    assert "30d, 12h, 90m" in bad.stderr
    assert len((await store.list_sessions()).sessions) == 5


async def test_list_oldest_and_older_than(cli, store) -> None:
    """``sessions list --oldest --older-than 30d`` shows what a policy would delete first."""
    await seed(store)
    page = await cli.json("sessions", "list", "--oldest", "--older-than", "30d", "--limit", "2")
    assert [s["session_id"] for s in page["sessions"]] == ["old0", "old1"]
    more = await cli.json(
        "sessions", "list", "--oldest", "--older-than", "30d", "--cursor", page["next_cursor"]
    )
    assert [s["session_id"] for s in more["sessions"]] == ["old2"]
