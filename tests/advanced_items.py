"""Items and run results the advanced-session tests share."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from agents.usage import InputTokensDetails, OutputTokensDetails, Usage
from sqlalchemy import func, select

from agents_memory import (
    AdvancedSQLAlchemySession,
    SessionStore,
    TableNames,
    create_engine,
    get_models,
)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def answer(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "output_text", "text": text}]}


def call(name: str, call_id: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": "{}"}


def output(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "ok"}


def run_result(requests: int, input_tokens: int, output_tokens: int) -> Any:
    """What store_run_usage reads of a RunResult: ``context_wrapper.usage``."""
    usage = Usage(
        requests=requests,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=input_tokens + output_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=1, cache_write_tokens=0),
        output_tokens_details=OutputTokensDetails(reasoning_tokens=2),
    )
    return SimpleNamespace(context_wrapper=SimpleNamespace(usage=usage))


async def advanced_view(url: str, names: TableNames, sid: str) -> dict[str, object]:
    """What an advanced session reads back: items per branch, turns, usage, tools."""
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    async with SessionStore.from_url(url, **kw) as store:
        s = store.advanced_session(sid)
        branches = [b["branch_id"] for b in await s.list_branches()]
        view: dict[str, object] = {"branches": branches}
        for b in branches:
            view[f"items:{b}"] = await s.get_items(branch_id=b)
            view[f"turns:{b}"] = [
                (t["turn"], t["full_content"]) for t in await s.get_conversation_turns(b)
            ]
            view[f"usage:{b}"] = await s.get_turn_usage(branch_id=b)
            view[f"tools:{b}"] = await s.get_tool_usage(b)
            view[f"by_turn:{b}"] = await s.get_conversation_by_turns(b)
        view["usage"] = await s.get_session_usage()
        return view


async def branched(s: AdvancedSQLAlchemySession) -> None:
    """main: 2 turns, a tool call, usage; alt: from turn 2, its own turn 2; gone: deleted.

    The session ends on ``alt``; ``gone`` has no rows left, but its name stays used.
    """
    await s.add_items([user("Grüße, first"), answer("one")])
    await s.store_run_usage(run_result(1, 10, 1))
    await s.add_items([user("second"), call("lookup", "c1"), output("c1"), answer("two")])
    await s.store_run_usage(run_result(2, 20, 2))
    await s.create_branch_from_turn(2, "alt")
    await s.add_items([user("second, again"), answer("two again")])
    await s.store_run_usage(run_result(3, 30, 3))
    await s.create_branch_from_turn(1, "gone")
    await s.add_items([user("on a branch soon deleted")])
    await s.switch_to_branch("alt")
    await s.delete_branch("gone")


async def advanced_counts(url: str, names: TableNames) -> list[int]:
    """How many structure, usage and branch-name rows the store at ``url`` holds."""
    models = get_models(names)
    tables = (models.Structure.__table__, models.TurnUsage.__table__, models.Branch.__table__)
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return [
                int((await conn.execute(select(func.count()).select_from(t))).scalar_one())
                for t in tables
            ]
    finally:
        await engine.dispose()
