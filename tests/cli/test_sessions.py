"""``agents-memory sessions …``: list, show, delete and stats, as text and as JSON."""

from __future__ import annotations

import datetime as dt
import json

from agents_memory import SessionStore
from agents_memory._sqlalchemy._bulk import ItemRecord, SessionRecord, SessionWrite, bulk_for

T0 = dt.datetime.fromisoformat("2024-06-01 08:00:00")


async def seed(store: SessionStore) -> None:
    """Five sessions updated one minute apart (s4 newest), s_i holding i+1 items."""
    writes = []
    for i in range(5):
        at = T0 + dt.timedelta(minutes=i)
        meta = {"user": f"u{i % 2}", "n": i}
        items = [ItemRecord({"role": "user", "content": f"q{i}.{k}"}, at) for k in range(i + 1)]
        writes.append(SessionWrite(SessionRecord(f"s{i}", at, at, meta), items))
    await bulk_for(store).write(writes)


async def test_list_newest_first_paginated(cli, store) -> None:
    """Sessions come newest-updated first with counts and times; cursors walk every page."""
    await seed(store)
    first = await cli.json("sessions", "list", "--limit", "2")
    assert [s["session_id"] for s in first["sessions"]] == ["s4", "s3"]
    assert first["sessions"][0]["item_count"] == 5
    assert first["sessions"][0]["updated_at"] == (T0 + dt.timedelta(minutes=4)).isoformat()
    assert first["sessions"][0]["metadata"] == {"user": "u0", "n": 4}
    seen = [s["session_id"] for s in first["sessions"]]
    cursor = first["next_cursor"]
    while cursor:
        page = await cli.json("sessions", "list", "--limit", "2", "--cursor", cursor)
        seen += [s["session_id"] for s in page["sessions"]]
        cursor = page["next_cursor"]
    assert seen == ["s4", "s3", "s2", "s1", "s0"]
    text = (await cli("sessions", "list", "--limit", "2")).stdout
    assert text.splitlines()[0].split() == ["SESSION", "ITEMS", "CREATED", "UPDATED", "METADATA"]
    assert "s4" in text
    assert "2024-06-01 08:04:00" in text
    assert f"--cursor {first['next_cursor']}" in text


async def test_list_filters_by_metadata(cli, store) -> None:
    """--metadata key=value matches text, key:=json numbers; several must all match."""
    await seed(store)
    u1 = await cli.json("sessions", "list", "--metadata", "user=u1")
    assert [s["session_id"] for s in u1["sessions"]] == ["s3", "s1"]
    both = await cli.json("sessions", "list", "-m", "user=u0", "-m", "n:=2")
    assert [s["session_id"] for s in both["sessions"]] == ["s2"]
    none = await cli("sessions", "list", "-m", "n=2")  # the text "2" is not the number 2
    assert "match the filter" in none.stdout


async def test_show_transcript_and_json(cli, store) -> None:
    """Show prints a numbered transcript (the latest N with --limit); --json the raw items."""
    session = store.session("chat")
    items = [
        {"role": "user", "content": "Wie spät ist es? ⏰"},
        {"type": "function_call", "call_id": "c1", "name": "clock", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "09:41"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Es ist 09:41."}]},
    ]
    await session.add_items(items)
    await session.set_metadata({"lang": "de"})
    text = (await cli("sessions", "show", "chat")).stdout.splitlines()
    assert text[0].startswith("session 'chat': 4 items, created ")
    assert text[1] == 'metadata: {"lang": "de"}'
    assert text[2:] == [
        "   1. user         Wie spät ist es? ⏰",
        "   2. tool call    clock({})",
        "   3. tool result  09:41",
        "   4. assistant    Es ist 09:41.",
    ]
    latest = (await cli("sessions", "show", "chat", "--limit", "2")).stdout.splitlines()
    assert latest[2] == "(the latest 2 of 4)"
    assert latest[3].startswith("   3. tool result")
    assert await cli.json("sessions", "show", "chat") == items
    assert await cli.json("sessions", "show", "chat", "--limit", "1") == items[-1:]
    assert await cli.json("sessions", "show", "chat", "--limit", "0") == []


async def test_show_missing_session(cli, store) -> None:
    """An unknown session is exit 1 naming it and the command that lists sessions."""
    await store.session("there").add_items([{"x": 1}])
    result = await cli("sessions", "show", "nope", code=1)
    assert "there is no session 'nope'" in result.stderr
    assert "agents-memory sessions list" in result.stderr


async def test_delete_asks_unless_yes(cli, store) -> None:
    """Delete asks (no keeps the session), deletes on yes or with --yes, and 404s after."""
    for sid in ("a", "b"):
        await store.session(sid).add_items([{"x": 1}, {"x": 2}])
    kept = await cli("sessions", "delete", "a", input="n\n", code=1)
    assert "Delete session 'a' and its 2 items" in kept.stdout
    assert await store.get_session("a") is not None
    done = await cli("sessions", "delete", "a", input="y\n")
    assert "deleted session 'a' (2 items)" in done.stdout
    assert await store.get_session("a") is None
    await cli("sessions", "delete", "b", "--yes")
    assert await store.get_session("b") is None
    await cli("sessions", "delete", "b", "--yes", code=1)


async def test_delete_frees_an_advanced_sessions_branch_names(cli, store) -> None:
    """`sessions delete` deletes everything of the session, its used branch names too."""
    from sqlalchemy import select  # noqa: PLC0415

    from agents_memory import get_models  # noqa: PLC0415

    s = store.advanced_session("adv")
    await s.add_items([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    await s.create_branch_from_turn(2, "alt")
    table = get_models(store.table_names).Branch.__table__
    query = select(table.c.branch_id).where(table.c.session_id == "adv")
    async with store.engine.connect() as conn:
        assert set((await conn.execute(query)).scalars()) == {"alt"}
    await cli("sessions", "delete", "adv", "--yes")
    async with store.engine.connect() as conn:
        assert set((await conn.execute(query)).scalars()) == set()
    again = store.advanced_session("adv")
    await again.add_items([{"role": "user", "content": "new"}])
    assert await again.create_branch_from_turn(1, "alt") == "alt"


async def test_stats(cli, store) -> None:
    """Stats counts sessions and items and names the largest, as text and JSON."""
    from agents_memory._codec import encode_stored_item  # noqa: PLC0415

    await seed(store)
    data = await cli.json("sessions", "stats", "--largest", "2")
    each = len(encode_stored_item({"role": "user", "content": "q0.0"}))  # (32, or 33 marked)
    assert data == {
        "sessions": 5,
        "items": 15,
        "oldest_created_at": T0.isoformat(),
        "newest_updated_at": (T0 + dt.timedelta(minutes=4)).isoformat(),
        "largest": [
            {"session_id": "s4", "item_count": 5, "bytes": 5 * each},
            {"session_id": "s3", "item_count": 4, "bytes": 4 * each},
        ],
    }
    text = (await cli("sessions", "stats")).stdout
    assert "sessions       5" in text
    assert "items          15" in text
    assert "  s4  5 items" in text


async def test_global_json_flag(cli, store) -> None:
    """--json before the command works like --json after it."""
    await seed(store)
    result = await cli.raw("--json", *cli.store_args, "sessions", "stats")
    assert json.loads(result.stdout)["items"] == 15


async def test_show_cuts_huge_items_unless_full(cli, store) -> None:
    """A 1 MB item prints as one short line with a marker; --full prints it whole."""
    big = "x" * 1_000_000
    await store.session("big").add_items([{"role": "user", "content": big}])
    short = await cli("sessions", "show", "big")
    [line] = [line for line in short.stdout.splitlines() if line.lstrip().startswith("1.")]
    assert len(line) < 1200
    assert "999,000 more characters; --full shows all]" in line
    full = await cli("sessions", "show", "big", "--full")
    assert big in full.stdout


async def test_ids_that_differ_by_spaces_are_shown_quoted(cli, store) -> None:
    """'a' and 'a ' are two sessions: the listing quotes the one a reader could not tell apart."""
    await store.session("a").add_items([{"n": 1}])
    await store.session("a ").add_items([{"n": 2}])
    listed = (await cli("sessions", "list")).stdout.splitlines()
    assert any(line.startswith("'a '") for line in listed), listed
    assert any(line.startswith("a ") and not line.startswith("a  '") for line in listed)
    stats = (await cli("sessions", "stats")).stdout
    assert "'a '" in stats


async def test_no_metadata_is_null_in_every_json_output(cli, store, tmp_path) -> None:
    """Sessions list --json and export agree: a session without metadata has metadata null."""
    await store.session("plain").add_items([{"n": 1}])
    listed = await cli.json("sessions", "list")
    assert [s["metadata"] for s in listed["sessions"]] == [None]
    out = tmp_path / "e.jsonl"
    await cli("export", "-o", str(out))
    header = json.loads(out.read_text().splitlines()[0])
    assert header["metadata"] is None


async def test_stats_gives_the_largest_sessions_size_in_bytes(cli, store) -> None:
    """Stats names each largest session's size in bytes (UTF-8, as stored), text and JSON."""
    from agents_memory._codec import encode_items  # noqa: PLC0415

    items = [{"role": "user", "content": "héllo ☔"}, {"role": "assistant", "content": "ok"}]
    await store.session("s").add_items(items)
    size = sum(len(text.encode()) for text in encode_items(items))
    totals = await cli.json("sessions", "stats")
    assert totals["largest"] == [{"session_id": "s", "item_count": 2, "bytes": size}]
    assert f"2 items, {size} bytes" in (await cli("sessions", "stats")).stdout
