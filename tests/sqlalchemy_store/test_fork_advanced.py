"""``store.fork`` of an advanced session carries its branches, turns and usage, everywhere.

The copy of the structure rows, the usage and the reserved branch names is part of
the fork's one transaction (``INSERT … SELECT`` on the database), on both runners.
"""

from __future__ import annotations

from typing import Any

import pytest
from advanced_items import answer, run_result, user

from agents_memory import AdvancedSQLAlchemySession, SessionStore


async def _source(store: SessionStore) -> AdvancedSQLAlchemySession:
    """main: 3 turns with usage; b: turn 1 of main and its own turn 2; 'gone' deleted."""
    s = store.advanced_session("src")
    for n in (1, 2, 3):
        await s.add_items([user(f"q{n}"), answer(f"a{n}")])
        await s.store_run_usage(run_result(n, 10 * n, n))
    await s.create_branch_from_turn(2, "b")
    await s.add_items([user("q2 on b"), answer("a2 on b")])
    await s.store_run_usage(run_result(7, 70, 7))
    await s.switch_to_branch("main")
    await s.create_branch_from_turn(3, "gone")
    await s.delete_branch("gone", force=True)
    return s


async def _view(s: AdvancedSQLAlchemySession) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for b in await s.list_branches():
        branch = b["branch_id"]
        out[branch] = {
            "items": await s.get_items(branch_id=branch),
            "turns": [t["full_content"] for t in await s.get_conversation_turns(branch)],
            "usage": [
                (u["user_turn_number"], u["requests"], u["input_tokens"])
                for u in await s.get_turn_usage(branch_id=branch)  # type: ignore[union-attr]
            ],
            "count": b["message_count"],
        }
    return out


async def test_a_whole_fork_carries_everything(rstore: SessionStore) -> None:
    """Branches, items per branch, turns, usage; names used by the source stay used."""
    src = await _source(rstore)
    await rstore.fork("src", "copy")
    copy = rstore.advanced_session("copy")
    assert await _view(copy) == await _view(src)
    assert set(await _view(copy)) == {"main", "b"}
    assert await copy.get_session_usage() == await src.get_session_usage()
    for name in ("b", "gone"):
        with pytest.raises(ValueError, match="already been used"):
            await copy.create_branch_from_turn(1, name)
    # the two go their own ways
    await copy.switch_to_branch("b")
    await copy.add_items([user("only in the copy")])
    await src.switch_to_branch("b")
    assert len(await src.get_items()) == 4
    assert len(await copy.get_items()) == 5
    await rstore.delete_session("src")
    assert len(await copy.get_items(branch_id="main")) == 6


async def test_a_fork_at_a_turn_carries_what_came_before(rstore: SessionStore) -> None:
    """``at_turn=3``: the items before the 3rd user item, their turn rows and their usage."""
    await _source(rstore)
    await rstore.fork("src", "early", at_turn=3)
    early = rstore.advanced_session("early")
    view = await _view(early)
    assert set(view) == {"main", "b"}
    assert view["main"]["items"] == [user("q1"), answer("a1"), user("q2"), answer("a2")]
    assert view["main"]["usage"] == [(1, 1, 10), (2, 2, 20)]
    assert view["b"]["items"] == [user("q1"), answer("a1")]  # b's own turn came later
    assert view["b"]["usage"] == []
    await early.add_items([user("q3 again")])
    assert [t["turn"] for t in await early.get_conversation_turns()] == [1, 2, 3]


async def test_a_plain_session_forks_as_before(rstore: SessionStore) -> None:
    """No structure rows: nothing extra is copied, and the fork reads the same."""
    await rstore.session("p").add_items([user("x"), answer("y")])
    await rstore.fork("p", "p2")
    assert await rstore.session("p2").get_items() == [user("x"), answer("y")]
    assert await rstore.advanced_session("p2").list_branches() == []
