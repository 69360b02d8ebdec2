"""A stale object's current branch after another object (or process) clears the session.

As the SDK's ``AdvancedSQLiteSession`` (its ``session_clear_generations``): the
clear moves the session's clear generation on, and an object still on a branch
of the old history acts on ``main`` from its next operation, on every database
and both runners (the clear's items go through the runner's connections).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from advanced_items import answer, call, run_result, user
from sqlalchemy import select

from agents_memory import AdvancedSQLAlchemySession, SessionStore, get_models

REPO = Path(__file__).resolve().parents[2]


async def stale_pair(store: SessionStore, sid: str) -> tuple[AdvancedSQLAlchemySession, Any]:
    """B on a branch 'stale' of three items; A, another object, then clears the session."""
    stale, clearer = store.advanced_session(sid), store.advanced_session(sid)
    await stale.add_items([user("u1"), answer("a1"), user("u2")])
    await stale.create_branch_from_turn(2, "stale")
    assert stale.current_branch_id == "stale"
    await clearer.clear_session()
    assert stale.current_branch_id == "stale"  # it cannot know yet
    return stale, clearer


async def generation(store: SessionStore, sid: str) -> int | None:
    table = get_models(store.table_names).ClearGeneration.__table__
    async with store.engine.connect() as conn:
        query = select(table.c.generation).where(table.c.session_id == sid)
        return (await conn.execute(query)).scalar()


async def test_next_add_goes_to_main(rstore: SessionStore) -> None:
    """The SDK's test_external_clear_resets_stale_branch_before_next_write, here."""
    stale, _ = await stale_pair(rstore, "add")
    await stale.add_items([user("after clear")])
    assert stale.current_branch_id == "main"
    assert await stale.get_items() == [user("after clear")]
    assert await stale.get_items(branch_id="stale") == []
    assert [b["branch_id"] for b in await stale.list_branches()] == ["main"]
    with pytest.raises(ValueError, match="already been used"):  # the name stays used
        await stale.create_branch_from_turn(1, "stale")
    assert await generation(rstore, "add") == 1


async def test_next_pop_takes_mains_tail(rstore: SessionStore) -> None:
    """The SDK's test_external_clear_resets_stale_branch_before_pop."""
    stale, clearer = await stale_pair(rstore, "pop")
    await clearer.add_items([user("after clear")])
    assert await stale.pop_item() == user("after clear")
    assert stale.current_branch_id == "main"
    assert await clearer.get_items() == []


@pytest.mark.parametrize(
    "read", ["items", "turns", "search", "conversation", "tools", "usage", "branches"]
)
async def test_next_read_reads_main(rstore: SessionStore, read: str) -> None:
    """The SDK's test_external_clear_resets_stale_branch_before_default_reads."""
    stale, clearer = await stale_pair(rstore, f"read-{read}")
    new = [user("new main question"), call("lookup", "c1"), answer("new main answer")]
    await clearer.add_items(new)
    await clearer.store_run_usage(run_result(1, 50, 30))
    if read == "items":
        assert await stale.get_items() == new
    elif read == "turns":
        turns = await stale.get_conversation_turns()
        assert [t["full_content"] for t in turns] == ["new main question"]
    elif read == "search":
        found = await stale.find_turns_by_content("new")
        assert [t["full_content"] for t in found] == ["new main question"]
    elif read == "conversation":
        assert set(await stale.get_conversation_by_turns()) == {1}
    elif read == "tools":
        assert await stale.get_tool_usage() == [("lookup", 1, 1)]
    elif read == "usage":
        one = await stale.get_turn_usage(1)
        assert isinstance(one, dict)
        assert (one["requests"], one["input_tokens"], one["output_tokens"]) == (1, 50, 30)
    else:
        branches = await stale.list_branches()
        assert [(b["branch_id"], b["is_current"]) for b in branches] == [("main", True)]
    assert stale.current_branch_id == "main"


async def test_replace_usage_and_a_new_branch_after_a_clear(rstore: SessionStore) -> None:
    """replace_items swaps main; a stale run's usage is not stored; branching starts on main."""
    stale, clearer = await stale_pair(rstore, "others")
    await clearer.add_items([user("m1"), answer("x")])
    await stale.store_run_usage(run_result(9, 9, 9))  # its turn was cleared: nothing stored
    assert await clearer.get_session_usage() is None
    assert stale.current_branch_id == "main"
    await stale.replace_items([user("r1"), answer("r"), user("r2")])
    assert await clearer.get_items() == [user("r1"), answer("r"), user("r2")]
    stale2, other = await stale_pair(rstore, "create")
    await other.add_items([user("m1"), user("m2")])
    assert await stale2.create_branch_from_turn(2, "from-main") == "from-main"
    assert await stale2.get_items() == [user("m1")]


async def test_an_object_that_switched_after_the_clear_stays(rstore: SessionStore) -> None:
    """A branch chosen after the clear is current: only a newer clear moves it again."""
    a, b = rstore.advanced_session("later"), rstore.advanced_session("later")
    await a.add_items([user("u1"), user("u2")])
    await a.clear_session()
    await a.add_items([user("v1"), user("v2")])
    await b.create_branch_from_turn(2, "after")
    await b.add_items([user("on after")])
    assert b.current_branch_id == "after"
    assert await b.get_items() == [user("v1"), user("on after")]
    await a.clear_session()
    assert await b.get_items() == []
    assert b.current_branch_id == "main"
    assert await generation(rstore, "later") == 2


async def test_a_clear_of_nothing_counts_nothing(rstore: SessionStore) -> None:
    """Plain sessions never write a generation; clearing a session with no row counts nothing."""
    await rstore.session("plain").add_items([user("x")])
    await rstore.session("plain").clear_session()
    assert await generation(rstore, "plain") is None
    await rstore.advanced_session("never").clear_session()
    assert await generation(rstore, "never") is None


async def test_deleting_the_session_deletes_its_generation(rstore: SessionStore) -> None:
    """delete_session frees the id whole: names and clear generation go (a clear keeps both)."""
    await stale_pair(rstore, "gone")
    assert await generation(rstore, "gone") == 1
    await rstore.delete_session("gone")
    assert await generation(rstore, "gone") is None


STALE_CHILD = textwrap.dedent(
    """
    import asyncio, json, os, sys, time
    from agents_memory import SessionStore
    url, sessions, messages, sid, what, folder = sys.argv[1:7]
    def wait_for(name):
        while not os.path.exists(os.path.join(folder, name)):
            time.sleep(0.005)
    async def main():
        store = SessionStore.from_url(url, sessions_table=sessions, messages_table=messages)
        s = store.advanced_session(sid)
        await s.switch_to_branch("stale")
        before = s.current_branch_id
        open(os.path.join(folder, "on-branch"), "w").close()
        wait_for("cleared")
        if what == "add":
            await s.add_items([{"role": "user", "content": "from the child"}])
            got = await s.get_items()
        elif what == "pop":
            got = [await s.pop_item()]
        else:
            got = await s.get_items()
        print(json.dumps({"before": before, "after": s.current_branch_id, "got": got}))
        await store.close()
    asyncio.run(main())
    """
)


@pytest.mark.parametrize("what", ["add", "get", "pop"])
async def test_a_clear_by_another_process(
    file_backend: Any, store: SessionStore, tmp_path: Path, what: str
) -> None:
    """B, in another process, is on a branch; A clears; B's next add/get/pop acts on main."""
    names = store.table_names
    a = store.advanced_session("procs")
    await a.add_items([user("u1"), answer("a1"), user("u2")])
    await a.create_branch_from_turn(2, "stale")
    await a.switch_to_branch("main")
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        STALE_CHILD,
        file_backend.url,
        names.sessions,
        names.messages,
        "procs",
        what,
        str(tmp_path),
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    while not (tmp_path / "on-branch").exists():
        assert child.returncode is None
        await asyncio.sleep(0.01)
    await a.clear_session()
    await a.add_items([user("main after the clear")])
    (tmp_path / "cleared").touch()
    out, _ = await child.communicate()
    assert child.returncode == 0
    seen = json.loads(out)
    assert (seen["before"], seen["after"]) == ("stale", "main")
    if what == "add":
        assert seen["got"] == [user("main after the clear"), user("from the child")]
        assert await a.get_items() == seen["got"]
    elif what == "pop":
        assert seen["got"] == [user("main after the clear")]
        assert await a.get_items() == []
    else:
        assert seen["got"] == [user("main after the clear")]
    assert await a.get_items(branch_id="stale") == []


async def test_a_switch_overtaken_by_this_objects_clear_stays_on_main(
    rstore: SessionStore, backend: Any
) -> None:
    """The SDK's test_stale_switch_after_clear_does_not_repoint_to_deleted_branch.

    The switch is held after it found the branch, before it reads the generation;
    the same object's clear runs to the end meanwhile; the switch then finishes
    and leaves the object on main (the clear wins).
    """
    if backend.id == "sqlite-memory":
        pytest.skip("one connection in memory: the held read would keep the clear waiting")
    s = rstore.advanced_session("race")
    await s.add_items([user("u1"), answer("a1"), user("u2"), answer("a2")])
    await s.create_branch_from_turn(2, "branch_a")
    await s.switch_to_branch("main")
    started, release = asyncio.Event(), asyncio.Event()
    real = s._generation_now

    async def held(conn: Any) -> int:
        started.set()
        await release.wait()
        return await real(conn)

    s._generation_now = held  # type: ignore[method-assign]
    switch = asyncio.create_task(s.switch_to_branch("branch_a"))
    await started.wait()
    del s._generation_now  # the clear reads it as usual
    await s.clear_session()
    assert not switch.done()  # the race happened: the clear finished first
    release.set()
    await switch
    assert s.current_branch_id == "main"
    assert await s.get_items() == []
