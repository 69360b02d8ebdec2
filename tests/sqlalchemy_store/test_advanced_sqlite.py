"""AdvancedSQLiteSession: the SDK's constructor over our tables; SDK-written files adopted."""

from __future__ import annotations

import asyncio
import inspect
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from advanced_items import answer, call, output, run_result, user
from agents.extensions import memory

from agents_memory import AdvancedSQLiteSession, SessionClosedError, TableNames, migrations

REPO = Path(__file__).resolve().parents[2]


def test_constructor_matches_the_sdk() -> None:
    """The SDK's parameters, with the same kinds and defaults, so only the import changes."""
    ours = inspect.signature(AdvancedSQLiteSession).parameters
    theirs = inspect.signature(memory.AdvancedSQLiteSession).parameters
    for name, param in theirs.items():
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            continue
        assert name in ours, name
        assert ours[name].kind == param.kind, name
        assert ours[name].default == param.default, name
    # What the SDK passes on to SQLiteSession through **kwargs.
    assert {"sessions_table", "messages_table"} <= set(ours)


async def test_in_memory_by_default_and_sync_close() -> None:
    """``AdvancedSQLiteSession(session_id=...)`` works in memory; close() is synchronous."""
    s = AdvancedSQLiteSession(session_id="m")
    await s.add_items([user("hi"), answer("hello")])
    await s.create_branch_from_turn(1, "again")
    await s.switch_to_branch("main")
    assert await s.get_items() == [user("hi"), answer("hello")]
    assert [b["branch_id"] for b in await s.list_branches()] == ["main"]  # 'again' is empty
    await s.aclose()
    with pytest.raises(SessionClosedError):
        await s.get_items()


def test_sync_close_outside_a_loop(tmp_path: Path) -> None:
    """close() from synchronous code (as SDK users call it) closes the engine."""
    s = AdvancedSQLiteSession(session_id="f", db_path=tmp_path / "f.db")
    s.close()
    s.close()  # twice is fine


async def sdk_file(path: Path) -> dict[str, Any]:
    """A database written by the SDK's AdvancedSQLiteSession: two branches, usage on both."""
    sdk = memory.AdvancedSQLiteSession(session_id="conv", db_path=path, create_tables=True)
    await sdk.add_items([user("Grüße, first"), answer("one")])
    await sdk.store_run_usage(run_result(1, 10, 1))
    await sdk.add_items([user("second"), call("lookup", "c1"), output("c1"), answer("two")])
    await sdk.store_run_usage(run_result(2, 20, 2))
    await sdk.create_branch_from_turn(2, "alt")
    await sdk.add_items([user("second, again"), answer("two again")])
    await sdk.store_run_usage(run_result(3, 30, 3))
    seen = {
        "main": await sdk.get_items(branch_id="main"),
        "alt": await sdk.get_items(branch_id="alt"),
        "usage": await sdk.get_session_usage(),
        "main_usage": await sdk.get_turn_usage(branch_id="main"),
        "turns": await sdk.get_conversation_turns(branch_id="main"),
        "tools": await sdk.get_tool_usage(branch_id="main"),
        "branches": [b["branch_id"] for b in await sdk.list_branches()],
    }
    sdk.close()
    return seen


async def assert_same_as_sdk(s: AdvancedSQLiteSession, seen: dict[str, Any]) -> None:
    assert await s.get_items(branch_id="main") == seen["main"]
    assert await s.get_items(branch_id="alt") == seen["alt"]
    assert await s.get_session_usage() == seen["usage"]
    ours = await s.get_turn_usage(branch_id="main")
    assert ours == seen["main_usage"]
    assert [(t["turn"], t["full_content"]) for t in await s.get_conversation_turns()] == [
        (t["turn"], t["full_content"]) for t in seen["turns"]
    ]
    assert await s.get_tool_usage() == [tuple(t) for t in seen["tools"]]
    # (The SDK orders branches created in the same second arbitrarily; ours oldest row first.)
    assert [b["branch_id"] for b in await s.list_branches()] == ["main", "alt"]
    assert sorted(seen["branches"]) == ["alt", "main"]
    # Writing carries on, on both branches; the SDK's used names stay used.
    await s.switch_to_branch("alt")
    await s.add_items([user("third on alt")])
    assert [t["turn"] for t in await s.get_conversation_turns()] == [1, 2, 3]
    with pytest.raises(ValueError, match="already been used"):
        await s.create_branch_from_turn(1, "alt")


async def test_sdk_file_is_adopted_in_place(tmp_path: Path) -> None:
    """An SDK-written file opens with ours (create_tables=True): branches and usage kept."""
    path = tmp_path / "sdk.db"
    seen = await sdk_file(path)
    assert len(seen["branches"]) == 2
    s = AdvancedSQLiteSession(session_id="conv", db_path=path, create_tables=True)
    try:
        await assert_same_as_sdk(s, seen)
        url = f"sqlite:///{path}"
        assert await migrations.current(url) == migrations.head()
        assert await migrations.check(url) == []
    finally:
        await s.aclose()


async def test_sdk_file_adopted_by_the_cli(tmp_path: Path) -> None:
    """`agents-memory db upgrade` adopts the SDK's file; then create_tables=False opens it."""
    path = tmp_path / "sdk.db"
    seen = await sdk_file(path)
    shutil.copy(path, tmp_path / "before.db")
    cli = Path(sys.executable).parent / "agents-memory"
    done = await asyncio.to_thread(
        subprocess.run,
        [str(cli), "db", "upgrade", "--url", f"sqlite:///{path}"],
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": str(REPO), "PATH": str(cli.parent)},
    )
    assert done.returncode == 0, done.stderr
    s = AdvancedSQLiteSession(session_id="conv", db_path=path)
    try:
        await assert_same_as_sdk(s, seen)
    finally:
        await s.aclose()


async def test_existing_file_needs_an_upgrade(tmp_path: Path) -> None:
    """An SDK file opened without create_tables says which command brings it up to date."""
    path = tmp_path / "sdk.db"
    await sdk_file(path)
    s = AdvancedSQLiteSession(session_id="conv", db_path=path)
    try:
        with pytest.raises(Exception, match="agents-memory db upgrade"):
            await s.get_conversation_turns()
    finally:
        await s.aclose()


async def test_sdk_names_of_a_cleared_session_stay_used(tmp_path: Path) -> None:
    """The SDK keeps a cleared session's names (no session row): adopted (0005), still used."""
    path = tmp_path / "sdk.db"
    sdk = memory.AdvancedSQLiteSession(session_id="gone", db_path=path, create_tables=True)
    await sdk.add_items([user("one"), answer("a"), user("two")])
    await sdk.create_branch_from_turn(2, "alt")
    await sdk.clear_session()
    sdk.close()
    s = AdvancedSQLiteSession(session_id="gone", db_path=path, create_tables=True)
    try:
        assert await s.get_items() == []
        await s.add_items([user("again")])
        for used in ("alt", "main"):
            with pytest.raises(ValueError, match="already been used"):
                await s.create_branch_from_turn(1, used)
        assert await s.create_branch_from_turn(1, "new") == "new"
    finally:
        await s.aclose()


async def test_sdk_clear_generations_are_adopted(tmp_path: Path) -> None:
    """The SDK's session_clear_generations (0007): kept, cleared sessions included."""
    path = tmp_path / "sdk.db"
    sdk = memory.AdvancedSQLiteSession(session_id="twice", db_path=path, create_tables=True)
    await sdk.add_items([user("one")])
    await sdk.clear_session()
    await sdk.add_items([user("two")])
    await sdk.clear_session()
    sdk.close()
    live = memory.AdvancedSQLiteSession(session_id="live", db_path=path)
    await live.add_items([user("kept")])
    await live.clear_session()
    await live.add_items([user("kept again")])
    live.close()
    s = AdvancedSQLiteSession(session_id="twice", db_path=path, create_tables=True)
    try:
        await s.add_items([user("u1"), user("u2")])
        await s.create_branch_from_turn(2, "b")
        other = AdvancedSQLiteSession(session_id="twice", db_path=path)
        try:
            await other.clear_session()  # the adopted 2, then 3
        finally:
            await other.aclose()
        assert await s.get_items() == []
        assert s.current_branch_id == "main"
    finally:
        await s.aclose()
    with sqlite3.connect(path) as conn:
        names = TableNames()
        rows = conn.execute(
            f"SELECT session_id, generation FROM {names.clear_generations} ORDER BY session_id"
        ).fetchall()
    assert rows == [("live", 1), ("twice", 3)]
