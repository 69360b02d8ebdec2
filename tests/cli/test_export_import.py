"""``export`` and ``import``: JSON Lines out and back in, exactly, resumably, all or nothing."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from agents_memory import SessionStore
from agents_memory._sqlalchemy._bulk import ItemRecord, SessionRecord, SessionWrite, bulk_for

T0 = dt.datetime.fromisoformat("2024-07-01 10:00:00.123456")
BIG = "x" * 1_000_000 + "🙂"


async def seed(store: SessionStore) -> None:
    """Sessions with unicode, control characters, a lone surrogate, a 1 MB item, metadata, none."""
    items = [
        {"role": "user", "content": "Grüße, 世界! 🌍 \u202e rtl \t tab"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "NUL \x00 and \ud800"}]},
        {"type": "function_call_output", "call_id": "c", "output": BIG},
        {"nested": {"list": [1, 2.5, None, True, {"deep": ["é"]}]}, "big_int": 2**62},
    ]
    at = [T0 + dt.timedelta(seconds=i) for i in range(len(items))]
    await bulk_for(store).write(
        [
            SessionWrite(
                SessionRecord("unicode-ü", T0, at[-1], {"user": "ü", "tags": ["a"]}),
                [ItemRecord(item, t) for item, t in zip(items, at, strict=True)],
            ),
            SessionWrite(SessionRecord("empty", T0, T0)),
        ]
    )
    await store.session("plain").add_items([{"role": "user", "content": "hi"}])


async def snapshot(store: SessionStore) -> list[tuple[SessionRecord, list[ItemRecord]]]:
    bulk = bulk_for(store)
    return [
        (s.record, [r async for r in bulk.rows(s.record.session_id, batch_size=2)])
        for s in await bulk.states_after(None, 100)
    ]


async def test_round_trip_is_exact(cli, store, tmp_path: Path) -> None:
    """Export, drop the tables, import: every session, item and time comes back identical."""
    await seed(store)
    before = await snapshot(store)
    path = tmp_path / "backup.jsonl"
    done = await cli("export", "-o", str(path), "--batch", "2")
    assert done.stdout.startswith("exported 3 sessions (5 items) from ")
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3 + 5
    assert json.loads(lines[0]) == {
        "session": "empty",
        "created_at": T0.isoformat(),
        "updated_at": T0.isoformat(),
        "metadata": None,
    }
    assert "世界" in path.read_text(encoding="utf-8")  # UTF-8 text, not \u escapes
    stdout = await cli("export")
    assert stdout.stdout_bytes == path.read_bytes()

    await cli("db", "downgrade", "base", "--yes")
    imported = await cli.json("import", str(path), "--batch", "3")
    assert imported == {
        "sessions": 3,
        "sessions_written": 3,
        "sessions_unchanged": 0,
        "items_written": 5,
        "items_present": 0,
        "advanced_sessions": 0,
        "advanced_skipped": 0,
        "advanced_cleared": 0,
    }
    assert await snapshot(store) == before


async def test_import_again_changes_nothing(cli, store, tmp_path: Path) -> None:
    """Importing the same file twice writes nothing the second time (no duplicates)."""
    await seed(store)
    path = tmp_path / "e.jsonl"
    await cli("export", "-o", str(path))
    before = await snapshot(store)
    again = await cli.json("import", str(path))
    assert again["items_written"] == 0
    assert again["sessions_unchanged"] == 3
    assert await snapshot(store) == before


async def test_import_modes_for_existing_sessions(cli, store, tmp_path: Path) -> None:
    """A diverged session stops the default import; skip, append and replace are explicit."""
    await store.session("s").add_items([{"n": 1}, {"n": 2}])
    path = tmp_path / "e.jsonl"
    await cli("export", "-o", str(path))
    await store.session("s").pop_item()
    await store.session("s").add_items([{"n": "changed"}])
    conflict = await cli("import", str(path), code=1)
    assert "session 's' already exists in the target" in conflict.stderr
    assert "--if-exists replace" in conflict.stderr
    await cli("import", str(path), "--if-exists", "skip")
    assert await store.session("s").get_items() == [{"n": 1}, {"n": "changed"}]
    await cli("import", str(path), "--if-exists", "append")
    assert len(await store.session("s").get_items()) == 4
    await cli("import", str(path), "--if-exists", "replace")
    assert await store.session("s").get_items() == [{"n": 1}, {"n": 2}]


async def test_bad_file_writes_nothing(cli, store, tmp_path: Path) -> None:
    """A malformed line anywhere is exit 1 naming the line, and nothing at all is imported."""
    await cli("db", "upgrade")
    good = '{"session":"a","created_at":"2024-01-01T00:00:00","updated_at":"2024-01-01T00:00:00",'
    good += '"metadata":null}\n'
    item = '{"item":{"x":1},"created_at":"2024-01-01T00:00:00"}\n'
    path = tmp_path / "bad.jsonl"
    path.write_text(good + item * 3 + '{"item":{"x":1}}\n', encoding="utf-8")
    result = await cli("import", str(path), code=1)
    assert "line 5:" in result.stderr
    assert await store.list_sessions() == (await store.list_sessions())  # readable
    assert (await store.list_sessions()).sessions == []
    path.write_bytes(good.encode() + b'{"item":{"x":"\xff"},"created_at":"2024-01-01"}\n')
    result = await cli("import", str(path), code=1)
    assert "line 2: the file is not UTF-8" in result.stderr


async def test_import_from_stdin(cli, store) -> None:
    """`import -` reads the export from standard input."""
    line = '{"session":"in","created_at":"2024-01-01T00:00:00","updated_at":"2024-01-01T00:00:00",'
    line += '"metadata":{"via":"stdin"}}\n{"item":{"ok":"✓"},"created_at":"2024-01-01T00:00:01"}\n'
    await cli("import", "-", input=line)
    assert await store.session("in").get_items() == [{"ok": "✓"}]
    assert await store.session("in").get_metadata() == {"via": "stdin"}


async def test_export_named_sessions(cli, store, tmp_path: Path) -> None:
    """Named sessions only; an unknown one is exit 1 and leaves no file behind."""
    await seed(store)
    out = (await cli("export", "plain", "empty")).stdout.splitlines()
    assert [json.loads(x).get("session") for x in out] == ["plain", None, "empty"]
    path = tmp_path / "never.jsonl"
    result = await cli("export", "plain", "missing", "-o", str(path), code=1)
    assert "no session 'missing'" in result.stderr
    assert not path.exists()
    assert not [p.name for p in tmp_path.iterdir() if "never" in p.name]  # noqa: ASYNC240


async def test_a_gzip_file_says_how_to_feed_it(cli, store, tmp_path) -> None:
    """`import x.jsonl.gz`: exit 1 naming `gunzip -c … | agents-memory import -`, which works."""
    import gzip  # noqa: PLC0415

    await store.session("g").add_items([{"n": 1}])
    plain = tmp_path / "backup.jsonl"
    await cli("export", "-o", str(plain))
    packed = tmp_path / "backup.jsonl.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    await store.session("g").clear_session()
    result = await cli("import", str(packed), code=1)
    assert f"gunzip -c {packed} | agents-memory import -" in result.stderr
    assert "UTF-8" not in result.stderr
    fed = gzip.decompress(packed.read_bytes()).decode()  # what `gunzip -c` pipes in
    await cli("import", "-", input=fed)
    assert await store.session("g").get_items() == [{"n": 1}]
