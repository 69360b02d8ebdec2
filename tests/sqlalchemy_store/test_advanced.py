"""AdvancedSQLAlchemySession: turns, branches and usage, on every backend."""

from __future__ import annotations

import asyncio
import itertools
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import agents
import pytest
import raw_rows
from advanced_items import answer, call, output, run_result, user
from agents import testing
from agents.usage import Usage
from session_contract import SessionContract
from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory import (
    AdvancedSQLAlchemySession,
    SessionSettings,
    SessionStore,
    TableNames,
    get_models,
)

REPO = Path(__file__).resolve().parents[2]


async def three_turns(s: AdvancedSQLAlchemySession) -> None:
    await s.add_items([user("first question"), answer("first answer")])
    await s.add_items([user("second question"), call("lookup", "c1"), output("c1")])
    await s.add_items([answer("second answer")])
    await s.add_items([user("third question"), answer("third answer")])


async def structure_rows(store: SessionStore) -> int:
    table = get_models(store.table_names).Structure.__table__
    async with store.engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())


async def test_turns_and_structure(store: SessionStore) -> None:
    """Each user message starts a turn; the items after it belong to it."""
    s = store.advanced_session("turns")
    await three_turns(s)
    turns = await s.get_conversation_turns()
    assert [(t["turn"], t["content"], t["can_branch"]) for t in turns] == [
        (1, "first question", True),
        (2, "second question", True),
        (3, "third question", True),
    ]
    assert all(isinstance(t["timestamp"], str) for t in turns)
    by_turn = await s.get_conversation_by_turns()
    assert by_turn == {
        1: [{"type": "user", "tool_name": None}, {"type": "assistant", "tool_name": None}],
        2: [
            {"type": "user", "tool_name": None},
            {"type": "function_call", "tool_name": "lookup"},
            {"type": "function_call_output", "tool_name": None},
            {"type": "assistant", "tool_name": None},
        ],
        3: [{"type": "user", "tool_name": None}, {"type": "assistant", "tool_name": None}],
    }
    assert await s.get_tool_usage() == [("lookup", 1, 2)]
    [main] = await s.list_branches()
    assert main["branch_id"] == "main"
    assert (main["message_count"], main["user_turns"], main["is_current"]) == (8, 3, True)
    assert await s.get_items(limit=2) == [user("third question"), answer("third answer")]
    # The protocol through a plain session of the same id sees the same items.
    assert await store.session("turns").get_items() == await s.get_items()


async def test_plain_sessions_write_no_structure(store: SessionStore) -> None:
    """Plain add_items leaves the advanced tables alone (it pays nothing for them)."""
    await store.session("plain").add_items([user("a"), answer("b")])
    assert await structure_rows(store) == 0
    assert await store.advanced_session("plain").get_conversation_turns() == []


async def test_branch_then_continue_both(store: SessionStore) -> None:
    """Branch from turn 2; each branch then grows on its own and the other is unchanged."""
    s = store.advanced_session("branching")
    await three_turns(s)
    before = await s.get_items()
    name = await s.create_branch_from_turn(2, "retry")
    assert name == "retry"
    assert s.current_branch_id == "retry"
    assert await s.get_items() == [user("first question"), answer("first answer")]
    await s.add_items([user("second question, asked differently"), answer("other answer")])
    turns = await s.get_conversation_turns()
    assert [t["turn"] for t in turns] == [1, 2]
    assert turns[1]["full_content"] == "second question, asked differently"

    await s.switch_to_branch("main")
    assert await s.get_items() == before
    await s.add_items([user("fourth question"), answer("fourth answer")])
    assert [t["turn"] for t in await s.get_conversation_turns()] == [1, 2, 3, 4]
    assert (await s.get_items(branch_id="retry"))[-1] == answer("other answer")
    assert len(await s.get_items(branch_id="retry")) == 4

    branches = {b["branch_id"]: b for b in await s.list_branches()}
    assert set(branches) == {"main", "retry"}
    assert branches["main"]["is_current"]
    assert (branches["retry"]["message_count"], branches["retry"]["user_turns"]) == (4, 2)
    assert [b["branch_id"] for b in await s.list_branches()] == ["main", "retry"]

    # Another object on the same session starts on main and can switch.
    other = store.advanced_session("branching")
    await other.switch_to_branch("retry")
    assert await other.get_items() == await s.get_items(branch_id="retry")
    auto = await other.create_branch_from_turn(1)
    assert auto.startswith("branch_from_turn_1_")
    assert await other.get_items() == []  # nothing before turn 1


async def test_branch_errors(store: SessionStore) -> None:
    """Bad turns, blank or used names and unknown branches are ValueErrors; nothing changes."""
    s = store.advanced_session("errors")
    await three_turns(s)
    with pytest.raises(ValueError, match="Turn 9 does not contain a user message"):
        await s.create_branch_from_turn(9)
    with pytest.raises(ValueError, match="cannot be empty"):
        await s.create_branch_from_turn(2, "  ")
    with pytest.raises(ValueError, match="already been used"):
        await s.create_branch_from_turn(2, "main")
    with pytest.raises(TypeError):
        await s.create_branch_from_turn("2")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not exist"):
        await s.switch_to_branch("nope")
    with pytest.raises(ValueError, match="No user turns found"):
        await s.create_branch_from_content("absent text")
    assert s.current_branch_id == "main"
    assert [b["branch_id"] for b in await s.list_branches()] == ["main"]


async def test_delete_branch_in_use(store: SessionStore) -> None:
    """The current branch goes only with force (then main is current); its name stays used."""
    s = store.advanced_session("delete")
    await three_turns(s)
    await s.create_branch_from_content("third", "alt")
    await s.add_items([user("alt question"), answer("alt answer")])
    await s.store_run_usage(run_result(1, 10, 5))
    with pytest.raises(ValueError, match="Cannot delete current branch"):
        await s.delete_branch("alt")
    with pytest.raises(ValueError, match="Cannot delete the 'main' branch"):
        await s.delete_branch("main")
    with pytest.raises(ValueError, match="empty"):
        await s.delete_branch("")
    await s.delete_branch("alt", force=True)
    assert s.current_branch_id == "main"
    assert [b["branch_id"] for b in await s.list_branches()] == ["main"]
    assert await s.get_session_usage() is None
    assert len(await s.get_items()) == 8
    # The branch's own items are gone; the shared ones stay with main.
    assert len(await store.session("delete").get_items()) == 8
    with pytest.raises(ValueError, match="does not exist"):
        await s.delete_branch("alt")
    with pytest.raises(ValueError, match="already been used"):
        await s.create_branch_from_turn(2, "alt")


async def test_usage_across_turns_and_branches(store: SessionStore) -> None:
    """Usage per turn, summed per branch and over all branches; storing again replaces."""
    s = store.advanced_session("usage")
    assert await s.get_session_usage() is None
    await s.add_items([user("q1"), answer("a1")])
    await s.store_run_usage(run_result(1, 100, 10))
    await s.add_items([user("q2"), answer("a2")])
    await s.store_run_usage(run_result(9, 9, 9))
    await s.store_run_usage(run_result(2, 200, 20))  # replaces turn 2's
    await s.create_branch_from_turn(2, "b")
    await s.add_items([user("q2b"), answer("a2b")])
    await s.store_run_usage(run_result(3, 300, 30))

    assert await s.get_session_usage() == {
        "requests": 6,
        "input_tokens": 600,
        "output_tokens": 60,
        "total_tokens": 660,
        "total_turns": 3,
    }
    assert await s.get_session_usage("main") == {
        "requests": 3,
        "input_tokens": 300,
        "output_tokens": 30,
        "total_tokens": 330,
        "total_turns": 2,
    }
    assert (await s.get_session_usage("b") or {})["total_tokens"] == 330
    per_turn = await s.get_turn_usage(branch_id="main")
    assert isinstance(per_turn, list)
    assert [(t["user_turn_number"], t["input_tokens"]) for t in per_turn] == [(1, 100), (2, 200)]
    details = run_result(0, 0, 0).context_wrapper.usage
    assert per_turn[0]["input_tokens_details"] == details.input_tokens_details.model_dump()
    assert per_turn[0]["output_tokens_details"] == details.output_tokens_details.model_dump()
    one = await s.get_turn_usage(2)
    assert isinstance(one, dict)
    assert one["requests"] == 3
    assert "user_turn_number" not in one
    assert await s.get_turn_usage(7) == {}


async def test_find_turns_non_ascii(engine: AsyncEngine, names: TableNames) -> None:
    """Accented, CJK and emoji text is found, stored escaped (ensure_ascii) or not."""
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    async with (
        SessionStore(engine, create_tables=True, **kw) as raw,
        SessionStore(engine, ensure_ascii=True, **kw) as escaped,
    ):
        for store in (raw, escaped):
            s = store.advanced_session(f"find-{store.ensure_ascii}")
            await s.add_items([user("Hello Grüße aus Köln 😀"), answer("Grüße!")])
            await s.add_items([user("中文 問題 with 100% _wild_ chars"), answer("ok")])
            await s.add_items([user("plain ascii HELLO")])
            found = await s.find_turns_by_content("grÜße")
            assert found == []  # non-ASCII letters match exactly (as the SDK's search)
            found = await s.find_turns_by_content("grüße")  # ASCII letters in any case
            assert [t["turn"] for t in found] == [1]
            assert found[0]["full_content"] == "Hello Grüße aus Köln 😀"
            assert [t["turn"] for t in await s.find_turns_by_content("😀")] == [1]
            assert [t["turn"] for t in await s.find_turns_by_content("問題")] == [2]
            assert [t["turn"] for t in await s.find_turns_by_content("100% _")] == [2]
            assert [t["turn"] for t in await s.find_turns_by_content("hello")] == [1, 3]
            assert await s.find_turns_by_content("%") == await s.find_turns_by_content("100%")
            branch = await s.create_branch_from_content("問題")
            assert [t["turn"] for t in await s.get_conversation_turns()] == [1]
            assert branch.startswith("branch_from_turn_2_")


async def test_pop_item_on_a_branch(store: SessionStore) -> None:
    """Pop takes the branch's newest item; an item main still holds stays for main."""
    s = store.advanced_session("pop")
    await three_turns(s)
    await s.create_branch_from_turn(3, "b")
    await s.store_run_usage(run_result(1, 1, 1))  # turn 2 on b
    assert await s.pop_item() == answer("second answer")
    assert await s.pop_item() == output("c1")
    assert await s.pop_item() == call("lookup", "c1")
    assert await s.get_turn_usage(2) != {}
    assert await s.pop_item() == user("second question")
    assert await s.get_turn_usage(2) == {}  # the turn is empty: its usage went with it
    await s.switch_to_branch("main")
    assert len(await s.get_items()) == 8
    await s.switch_to_branch("b")
    assert await s.pop_item() == answer("first answer")
    assert await s.pop_item() == user("first question")
    assert await s.pop_item() is None
    assert len(await store.session("pop").get_items()) == 8


async def test_clear_session_removes_everything(store: SessionStore) -> None:
    """Clearing drops items, branches and usage and returns to main; names stay used (SDK)."""
    s = store.advanced_session("clear")
    await three_turns(s)
    await s.store_run_usage(run_result(1, 1, 1))
    await s.create_branch_from_turn(2, "b")
    await s.clear_session()
    assert s.current_branch_id == "main"
    assert await s.list_branches() == []
    assert await s.get_session_usage() is None
    assert await structure_rows(store) == 0
    assert await store.get_session("clear") is None
    await s.add_items([user("again")])
    assert [t["turn"] for t in await s.get_conversation_turns()] == [1]
    for used in ("b", "main"):  # as the SDK: every name used before the clear stays used
        with pytest.raises(ValueError, match="already been used"):
            await s.create_branch_from_turn(1, used)
    assert await s.create_branch_from_turn(1, "c") == "c"


async def branch_names(store: SessionStore, sid: str) -> set[str]:
    table = get_models(store.table_names).Branch.__table__
    async with store.engine.connect() as conn:
        query = select(table.c.branch_id).where(table.c.session_id == sid)
        return set((await conn.execute(query)).scalars())


async def test_names_outlive_a_clear_by_another_object(store: SessionStore) -> None:
    """Another object's clear (no session row left) keeps the names; the same as the SDK."""
    a, b = store.advanced_session("names"), store.advanced_session("names")
    await three_turns(a)
    await a.create_branch_from_turn(2, "alt")
    await b.clear_session()
    assert await store.get_session("names") is None
    assert await branch_names(store, "names") == {"main", "alt"}
    await b.add_items([user("fresh")])
    with pytest.raises(ValueError, match="already been used"):
        await b.create_branch_from_turn(1, "alt")
    auto = await b.create_branch_from_turn(1)
    assert auto.startswith("branch_from_turn_1_")
    assert await branch_names(store, "names") == {"main", "alt", auto}


async def test_deleting_a_session_deletes_its_names(store: SessionStore) -> None:
    """delete_session removes everything of the session, its used names too (a clear does not)."""
    s = store.advanced_session("gone")
    await three_turns(s)
    await s.create_branch_from_turn(2, "alt")
    other = store.advanced_session("kept")
    await three_turns(other)
    await other.create_branch_from_turn(2, "alt")
    assert await store.delete_session("gone") is True
    assert await branch_names(store, "gone") == set()
    assert await branch_names(store, "kept") == {"alt"}  # main: reserved by a clear
    # Cleared first (names kept, no session row): deleting it still deletes the names.
    await other.clear_session()
    assert await branch_names(store, "kept") == {"main", "alt"}
    assert await store.delete_session("kept") is False
    assert await branch_names(store, "kept") == set()
    fresh = store.advanced_session("gone")
    await fresh.add_items([user("again")])
    assert await fresh.create_branch_from_turn(1, "alt") == "alt"


async def test_bad_input_is_refused_before_writing(store: SessionStore) -> None:
    """Items that are not JSON dicts are a TypeError and nothing is stored."""
    s = store.advanced_session("bad")
    with pytest.raises(TypeError):
        await s.add_items([user("ok"), object()])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="at most 255"):
        await s.switch_to_branch("x" * 256)
    assert await s.get_items() == []
    assert await store.get_session("bad") is None


async def test_concurrent_writers_one_session(store: SessionStore) -> None:
    """Many tasks appending turns at once: every turn number and position is unique."""
    s = store.advanced_session("tasks")
    await asyncio.gather(*(s.add_items([user(f"q{i}"), answer(f"a{i}")]) for i in range(12)))
    turns = await s.get_conversation_turns()
    assert [t["turn"] for t in turns] == list(range(1, 13))
    by_turn = await s.get_conversation_by_turns()
    assert all(len(items) == 2 for items in by_turn.values())


WRITER = textwrap.dedent(
    """
    import asyncio, os, sys, time
    from agents_memory import SessionStore
    url, sessions, messages, tag, start, n = sys.argv[1:7]
    async def main():
        store = SessionStore.from_url(url, sessions_table=sessions, messages_table=messages)
        s = store.advanced_session("shared")
        await s.get_items(limit=1)  # connected, schema checked
        open(os.path.join(os.path.dirname(start), "ready-" + tag), "w").close()
        while not os.path.exists(start):
            time.sleep(0.005)
        for i in range(int(n)):
            await s.add_items([
                {"role": "user", "content": f"{tag}{i}"},
                {"role": "assistant", "content": f"{tag}{i} done"},
            ])
        await store.close()
    asyncio.run(main())
    """
)


async def test_two_processes_write_one_session(
    file_backend: Any, store: SessionStore, tmp_path: Path
) -> None:
    """Two processes append turns to one advanced session at once: no turn is lost or shared."""
    names = store.table_names
    await store.advanced_session("shared").add_items([user("seed")])
    start = tmp_path / "go"
    n = 25
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            WRITER,
            file_backend.url,
            names.sessions,
            names.messages,
            tag,
            str(start),
            str(n),
            env=env,
        )
        for tag in ("A", "B")
    ]
    # Start both at once, when both are at the start line (imports done, store open).
    while not all((tmp_path / f"ready-{tag}").exists() for tag in "AB"):
        assert all(p.returncode is None for p in procs)
        await asyncio.sleep(0.01)
    start.touch()
    for proc in procs:
        assert await proc.wait() == 0
    s = store.advanced_session("shared")
    turns = await s.get_conversation_turns()
    assert [t["turn"] for t in turns] == list(range(1, 2 * n + 2))
    order = [t["content"] for t in turns[1:]]
    assert sorted(order) == sorted(f"{tag}{i}" for tag in "AB" for i in range(n))
    # Each process's turns stay in its own order; and they did interleave (a real race).
    for tag in "AB":
        mine = [c for c in order if c.startswith(tag)]
        assert mine == [f"{tag}{i}" for i in range(n)]
    switches = sum(1 for a, b in itertools.pairwise(order) if a[0] != b[0])
    assert switches >= 1
    items = await s.get_items()
    assert len(items) == 1 + 4 * n
    for turn in turns[1:]:  # every answer directly follows its question
        i = items.index(user(turn["content"]))
        assert items[i + 1]["content"] == f"{turn['content']} done"


async def test_runner_with_branches_and_usage(store: SessionStore) -> None:
    """The real Runner with a scripted model: turns, usage per turn, and a branch.

    The branch re-asks turn 2; the model then sees only turn 1 and the new question.
    """
    steps = [
        testing.ModelStep(
            output=[testing.assistant_message(text)],
            usage=Usage(requests=1, input_tokens=tokens, output_tokens=5, total_tokens=tokens + 5),
        )
        for text, tokens in (("Paris.", 10), ("About 2.1 million.", 20), ("Lyon.", 30))
    ]
    model = testing.ScriptedModel(steps)
    agent = agents.Agent(name="geo", instructions="Answer briefly.", model=model)
    s = store.advanced_session("runner")
    for question in ("Capital of France?", "How many people live there?"):
        result = await agents.Runner.run(agent, question, session=s)
        await s.store_run_usage(result)
    await s.create_branch_from_turn(2, "second-city")
    result = await agents.Runner.run(agent, "And the second city?", session=s)
    await s.store_run_usage(result)
    assert result.final_output == "Lyon."
    last_input = str(model.calls[-1].input)
    assert "Capital of France?" in last_input
    assert "How many people" not in last_input
    main = await s.get_turn_usage(branch_id="main")
    assert [(t["user_turn_number"], t["input_tokens"]) for t in main] == [(1, 10), (2, 20)]
    branch = await s.get_turn_usage()
    assert [(t["user_turn_number"], t["input_tokens"]) for t in branch] == [(2, 30)]
    assert (await s.get_session_usage() or {})["input_tokens"] == 60


class AdvancedHarness:
    """The Session contract's view of advanced sessions (on their ``main`` branch)."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store

    def session(
        self, session_id: str, *, session_settings: SessionSettings | None = None
    ) -> AdvancedSQLAlchemySession:
        """An advanced session of the store."""
        return self.store.advanced_session(session_id, session_settings=session_settings)

    async def exists(self, session_id: str) -> bool:
        """Whether the store lists the session."""
        return await self.store.get_session(session_id) is not None

    async def insert_raw(self, session_id: str, data: str) -> None:
        """A message row and its place on ``main``, written with SQL behind the session."""
        s = get_models(self.store.table_names).Structure.__table__
        async with self.store.engine.begin() as conn:
            position = await raw_rows.append_raw(conn, self.store.table_names, session_id, data)
            seq = (await conn.execute(select(func.max(s.c.sequence_number)))).scalar() or 0
            await conn.execute(
                insert(s).values(
                    session_id=session_id,
                    message_position=position,
                    branch_id="main",
                    message_type="other",
                    sequence_number=seq + 1,
                    user_turn_number=0,
                    branch_turn_number=0,
                )
            )


class TestAdvancedSessionContract(SessionContract):
    """The shared Session contract, for advanced sessions of a store on every backend."""

    @pytest.fixture
    def harness(self, store: SessionStore) -> AdvancedHarness:
        """The backend's store, handing out advanced sessions."""
        return AdvancedHarness(store)


async def test_tool_names_as_the_sdk_names_them(store: SessionStore) -> None:
    """Namespaces kept, same-name namespaces collapsed, tool search counted once, MCP labelled."""
    s = store.advanced_session("tools")
    fc = "function_call"
    await s.add_items(
        [
            user("look up"),
            {"type": fc, "name": "lookup", "namespace": "crm", "call_id": "1", "arguments": ""},
            {"type": fc, "name": "lookup", "namespace": "billing", "call_id": "2", "arguments": ""},
            {
                "type": fc,
                "name": "weather",
                "namespace": "weather",
                "call_id": "3",
                "arguments": "",
            },
            {"type": "tool_search_call", "id": "t1", "arguments": {}},
            {"type": "tool_search_output", "id": "t2", "tools": []},
            {"type": "mcp_call", "server_label": "docs", "name": "read", "id": "m"},
            {"type": "shell_call", "id": "sh"},
            user("search only"),
            {"type": "tool_search_output", "id": "t3", "tools": []},
        ]  # type: ignore[list-item]
    )
    usage = await s.get_tool_usage()
    assert sorted(usage) == sorted(
        [
            ("crm.lookup", 1, 1),
            ("billing.lookup", 1, 1),
            ("weather", 1, 1),
            ("tool_search", 1, 1),
            ("docs.read", 1, 1),
            ("shell_call", 1, 1),
            ("tool_search", 1, 2),
        ]
    )
    assert [turn for _name, _n, turn in usage] == sorted(turn for _name, _n, turn in usage)
