"""Advanced sessions through ``export``/``import`` (and cleared sessions' names through ``copy``).

Export from the database under test, import into another (a SQLite file) and back
into the database under test: the advanced API answers the same (turns, branches,
usage, current-branch contents), names used before a clear stay used, a re-run adds
nothing, and ``replace``/``append`` behave as they do for items.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import raw_rows
from advanced_items import advanced_counts, advanced_view, answer, branched, user
from sqlalchemy import select

from agents_memory import SessionStore, TableNames, create_engine, get_models, migrations


def kw(names: TableNames) -> dict[str, str]:
    return {"sessions_table": names.sessions, "messages_table": names.messages}


async def seed(url: str, names: TableNames) -> None:
    """A plain session, an advanced one (two branches, usage, a deleted branch), a cleared one."""
    async with SessionStore.from_url(url, **kw(names)) as store:
        await store.session("plain").add_items([user("plain")])
        await branched(store.advanced_session("adv"))
        wiped = store.advanced_session("wiped")
        await wiped.add_items([user("w1"), user("w2")])
        await wiped.create_branch_from_turn(2, "w-alt")
        await wiped.clear_session()


async def names_of(url: str, names: TableNames, sid: str) -> set[str]:
    branches = get_models(names).Branch.__table__
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            query = select(branches.c.branch_id).where(branches.c.session_id == sid)
            return set((await conn.execute(query)).scalars())
    finally:
        await engine.dispose()


async def assert_names_used(url: str, names: TableNames) -> None:
    """The names used before (a deleted branch's, a cleared session's) are still used."""
    async with SessionStore.from_url(url, **kw(names)) as store:
        adv = store.advanced_session("adv")
        await adv.switch_to_branch("alt")
        assert await adv.get_items() == [
            user("Grüße, first"),
            answer("one"),
            user("second, again"),
            answer("two again"),
        ]
        wiped = store.advanced_session("wiped")
        assert await wiped.get_items() == []
        await wiped.add_items([user("again")])
        for sid, used in (("adv", "gone"), ("wiped", "w-alt"), ("wiped", "main")):
            with pytest.raises(ValueError, match="already been used"):
                await store.advanced_session(sid).create_branch_from_turn(1, used)
        await wiped.clear_session()


async def test_round_trip_between_databases(cli: Any, tmp_path: Path) -> None:
    """Export here, import into a SQLite file and back here: the same answers everywhere."""
    names = cli.names
    await migrations.upgrade(cli.url, **kw(names))
    await seed(cli.url, names)
    expected = await advanced_view(cli.url, names, "adv")
    assert expected["branches"] == ["main", "alt"]
    path = tmp_path / "adv.jsonl"
    done = await cli.json("export", "-o", str(path))
    assert (done["advanced_sessions"], done["advanced_skipped"], done["advanced_cleared"]) == (
        1,
        0,
        1,
    )
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    kinds = [next(iter(line)) for line in lines]
    assert kinds.count("structure") == 6 + 4  # main's items, and alt's (2 shared, 2 own)
    assert kinds.count("usage") == 3
    assert sorted(line["branch"] for line in lines if "branch" in line) == [
        "alt",
        "gone",
        "main",
        "w-alt",
    ]
    assert kinds[-2:] == ["cleared_session", "cleared_session"]  # after every session
    first = next(line for line in lines if "structure" in line)
    assert first["structure"]["item"] == 1

    other = f"sqlite+aiosqlite:///{tmp_path / 'other.db'}"
    imported = await cli.raw("import", str(path), "--url", other, *_tables(names), "--json")
    assert imported.exit_code == 0, imported.stderr
    result = json.loads(imported.stdout)
    assert (result["advanced_sessions"], result["advanced_skipped"]) == (1, 0)
    assert result["advanced_cleared"] == 1
    assert await advanced_view(other, names, "adv") == expected
    assert await names_of(other, names, "wiped") == {"main", "w-alt"}
    before = await advanced_counts(other, names)
    again = await cli.raw("import", str(path), "--url", other, *_tables(names), "--json")
    assert json.loads(again.stdout)["items_written"] == 0
    assert await advanced_counts(other, names) == before  # no duplicates
    await assert_names_used(other, names)

    # and into the database under test, from scratch
    await cli("db", "downgrade", "base", "--yes")
    back = await cli.json("import", str(path))
    assert (back["advanced_sessions"], back["advanced_cleared"]) == (1, 1)
    assert await advanced_view(cli.url, names, "adv") == expected
    await assert_names_used(cli.url, names)


def _tables(names: TableNames) -> list[str]:
    return ["--sessions-table", names.sessions, "--messages-table", names.messages]


async def test_resume_replace_and_append(cli: Any, tmp_path: Path) -> None:
    """Resume finishes a partial session, then carries its rows; replace restores them.

    Append keeps the target's items and leaves the rows alone.
    """
    names = cli.names
    await migrations.upgrade(cli.url, **kw(names))
    await seed(cli.url, names)
    expected = await advanced_view(cli.url, names, "adv")
    path = tmp_path / "adv.jsonl"
    await cli("export", "-o", str(path))
    await cli("db", "downgrade", "base", "--yes")
    await migrations.upgrade(cli.url, **kw(names))
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    assert json.loads(lines[0])["session"] == "adv"
    partial = tmp_path / "partial.jsonl"
    partial.write_text("".join(lines[:4]), encoding="utf-8")  # an interrupted import
    first = await cli.json("import", str(partial))
    assert (first["items_written"], first["advanced_sessions"]) == (3, 0)
    resumed = await cli.json("import", str(path))
    assert (resumed["items_written"], resumed["advanced_sessions"]) == (8 - 3 + 1, 1)
    assert await advanced_view(cli.url, names, "adv") == expected
    async with SessionStore.from_url(cli.url, **kw(names)) as store:  # a diverged target
        await store.session("adv").pop_item()
        await store.session("adv").add_items([{"role": "user", "content": "changed"}])
    conflict = await cli("import", str(path), code=1)  # the times differ: not a prefix
    assert "session 'adv' already exists" in conflict.stderr
    replaced = await cli.json("import", str(path), "--if-exists", "replace")
    assert (replaced["advanced_sessions"], replaced["advanced_skipped"]) == (1, 0)
    assert await advanced_view(cli.url, names, "adv") == expected
    again = await cli.json("import", str(path))
    assert again["items_written"] == 0
    assert again["advanced_sessions"] == 1
    assert await advanced_view(cli.url, names, "adv") == expected
    async with SessionStore.from_url(cli.url, **kw(names)) as store:
        await store.advanced_session("adv").add_items([user("target's own")])
    view = await advanced_view(cli.url, names, "adv")
    appended = await cli.json("import", str(path), "--if-exists", "append")
    assert (appended["advanced_sessions"], appended["advanced_skipped"]) == (0, 0)
    assert await advanced_view(cli.url, names, "adv") == view  # only plain items were added
    skipped = await cli.json("import", str(path), "--if-exists", "replace")
    assert skipped["advanced_sessions"] == 1
    assert await advanced_view(cli.url, names, "adv") == expected


async def test_a_corrupt_item_leaves_the_rows_out(cli: Any, tmp_path: Path) -> None:
    """Export skips a corrupt row; the positions would not match, so the session's rows stay out."""
    names = cli.names
    await migrations.upgrade(cli.url, **kw(names))
    await seed(cli.url, names)
    engine = create_engine(cli.url)
    try:
        await raw_rows.insert_raw(engine, names, "adv", "{not json")
    finally:
        await engine.dispose()
    path = tmp_path / "adv.jsonl"
    done = await cli.json("export", "-o", str(path))
    assert (done["advanced_sessions"], done["advanced_skipped"]) == (0, 1)
    text = path.read_text(encoding="utf-8")
    assert '"structure"' not in text
    assert '"cleared_session":"wiped"' in text


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        (
            {"structure": {"item": 3, "branch_id": "main", "message_type": "user",
                           "sequence_number": 1, "user_turn_number": 1,
                           "branch_turn_number": 1, "tool_name": None}},
            "structure row of item 3, but session 'a' has 2 items",
        ),
        ({"structure": {"item": 1}}, '"structure" must be an object with the keys'),
        ({"branch": ""}, '"branch" must be a branch name'),
        (
            {"usage": {"branch_id": "main", "user_turn_number": "1", "requests": 1,
                       "input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
                       "input_tokens_details": None, "output_tokens_details": None}},
            '"usage.user_turn_number" must be int',
        ),
    ],
)  # fmt: skip
async def test_bad_advanced_lines_write_nothing(
    cli: Any, tmp_path: Path, line: dict[str, Any], problem: str
) -> None:
    """A bad advanced line is exit 1 naming the line; nothing of the file is imported."""
    await cli("db", "upgrade")
    at = "2024-01-01T00:00:00"
    header = {"session": "a", "created_at": at, "updated_at": at, "metadata": None}
    item = {"item": {"role": "user", "content": "x"}, "created_at": at}
    rows = [header, item, item, {**line, "created_at": at}]
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    result = await cli("import", str(path), code=1)
    assert "line 4:" in result.stderr
    assert problem in result.stderr
    async with SessionStore.from_url(cli.url, **kw(cli.names)) as store:
        assert (await store.list_sessions()).sessions == []
    rows = [header, item, {"branch": "b", "created_at": at}, item]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    late = await cli("import", str(path), code=1)
    assert "line 4: an item after the session's structure" in late.stderr


async def test_copy_carries_names_of_cleared_sessions(cli: Any, tmp_path: Path) -> None:
    """A session cleared in the source (names, no row): its names are used in the target too."""
    names = cli.names
    source = f"sqlite+aiosqlite:///{tmp_path / 'src.db'}"
    await migrations.upgrade(source, **kw(names))
    await seed(source, names)
    result = await cli.json("copy", "--from", source, "--to", cli.url)
    assert (result["advanced_sessions"], result["advanced_cleared"]) == (1, 1)
    assert await names_of(cli.url, names, "wiped") == {"main", "w-alt"}
    again = await cli.json("copy", "--from", source, "--to", cli.url)
    assert again["advanced_cleared"] == 1
    assert await names_of(cli.url, names, "wiped") == {"main", "w-alt"}
    await assert_names_used(cli.url, names)
    # names already used in the target are kept, the source's are added
    async with SessionStore.from_url(cli.url, **kw(names)) as store:
        w = store.advanced_session("wiped")
        await w.add_items([user("x"), user("y")])
        await w.create_branch_from_turn(2, "target-only")
    await cli.json("copy", "--from", source, "--to", cli.url)
    assert await names_of(cli.url, names, "wiped") == {"main", "w-alt", "target-only"}
