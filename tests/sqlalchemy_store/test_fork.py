"""``SessionStore.fork``: a copy of a session, up to a turn, in one transaction on the database."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import raw_rows
from sqlalchemy.exc import DBAPIError

from agents_memory import (
    SessionExistsError,
    SessionNotFoundError,
    SessionStore,
    TurnNotFoundError,
)


def conversation(turns: int) -> list[dict[str, Any]]:
    """``turns`` user turns, each: the user's message, a tool call and output, an answer."""
    items: list[dict[str, Any]] = []
    for t in range(1, turns + 1):
        items += [
            {"role": "user", "content": f"question {t} — ça va? 你好", "type": "message"},
            {"type": "function_call", "call_id": f"c{t}", "name": "look", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{t}", "output": "ok"},
            {"role": "assistant", "content": f"answer {t}", "type": "message"},
        ]
    return items


async def test_fork_copies_items_and_metadata(rstore: SessionStore) -> None:
    """The fork holds the same items in order and the same metadata; the two then diverge."""
    source = rstore.session("src")
    await source.add_items(conversation(3))  # type: ignore[arg-type]
    await source.set_metadata({"user": "u1", "n": 2})
    fork = await rstore.fork("src", "dst")
    assert fork.session_id == "dst"
    assert await fork.get_items() == conversation(3)
    assert await fork.get_metadata() == {"user": "u1", "n": 2}
    info = await rstore.get_session("dst")
    assert info is not None
    assert info.item_count == 12
    # independent from now on
    await fork.add_items([{"role": "user", "content": "only in the fork"}])
    await source.pop_item()
    assert len(await fork.get_items()) == 13
    assert await source.get_items() == conversation(3)[:-1]


@pytest.mark.parametrize("turn", [1, 2, 3])
async def test_fork_at_turn_matches_the_sdk_branch(rstore: SessionStore, turn: int) -> None:
    """``at_turn=N``: what came before the N-th user message, as ``create_branch_from_turn(N)``."""
    source = rstore.session("t")
    await source.add_items(conversation(3))  # type: ignore[arg-type]
    fork = await rstore.fork("t", f"t-at-{turn}", at_turn=turn)
    assert await fork.get_items() == conversation(3)[: 4 * (turn - 1)]
    assert await rstore.get_session(f"t-at-{turn}") is not None


async def test_fork_at_turn_skips_corrupt_and_non_user_rows(
    backend: Any, rstore: SessionStore
) -> None:
    """Turns count only items whose role is ``"user"``: other roles and non-objects do not."""
    source = rstore.session("mixed")
    await source.add_items(
        [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "one"},
            {"content": "user", "type": "message"},  # "user" is not its role
            {"role": ["user"], "content": "odd role"},
            {"role": "user", "content": "two"},
        ]
    )
    fork = await rstore.fork("mixed", "mixed-2", at_turn=2)
    assert [i.get("content") for i in await fork.get_items()] == [
        "be brief",
        "one",
        "user",
        "odd role",
    ]
    with pytest.raises(TurnNotFoundError):
        await rstore.fork("mixed", "mixed-3", at_turn=3)
    assert await rstore.get_session("mixed-3") is None
    del backend


async def test_fork_errors_write_nothing(rstore: SessionStore) -> None:
    """Missing source, existing target, missing turn, bad arguments: typed, nothing written."""
    source = rstore.session("a")
    await source.add_items(conversation(2))  # type: ignore[arg-type]
    taken = rstore.session("taken")
    await taken.add_items([{"role": "user", "content": "mine"}])
    with pytest.raises(SessionNotFoundError):
        await rstore.fork("missing", "b")
    assert await rstore.get_session("b") is None
    with pytest.raises(SessionExistsError):
        await rstore.fork("a", "taken")
    assert await taken.get_items() == [{"role": "user", "content": "mine"}]
    with pytest.raises(TurnNotFoundError):
        await rstore.fork("a", "b", at_turn=3)
    assert await rstore.get_session("b") is None
    with pytest.raises(ValueError, match="differ"):
        await rstore.fork("a", "a")
    with pytest.raises(ValueError, match="from 1"):
        await rstore.fork("a", "b", at_turn=0)
    with pytest.raises(TypeError):
        await rstore.fork("a", "b", at_turn=True)
    with pytest.raises(TypeError):
        await rstore.fork("a", 3)  # type: ignore[arg-type]
    assert await rstore.get_session("b") is None
    # errors are also what their standard classes say
    assert issubclass(SessionNotFoundError, LookupError)
    assert issubclass(SessionExistsError, ValueError)
    assert issubclass(TurnNotFoundError, ValueError)


async def test_concurrent_forks_to_one_target_one_wins(rstore: SessionStore) -> None:
    """Forks of different sources raced to one new id: exactly one wins, each loser is typed.

    The winner's copy is whole (its own source's items, nothing mixed in).
    """
    for n in range(4):
        await rstore.session(f"s{n}").add_items(
            [{"role": "user", "content": f"from {n}", "k": k} for k in range(200)]
        )
    for round_ in range(5):
        target = f"target-{round_}"
        results = await asyncio.gather(
            *(rstore.fork(f"s{n}", target) for n in range(4)), return_exceptions=True
        )
        won = [r for r in results if not isinstance(r, BaseException)]
        lost = [r for r in results if isinstance(r, BaseException)]
        assert len(won) == 1, results
        assert all(isinstance(e, SessionExistsError) for e in lost), lost
        items = await won[0].get_items()
        assert len(items) == 200
        assert len({i["content"] for i in items}) == 1


async def test_fork_while_appending_copies_whole_batches(rstore: SessionStore) -> None:
    """Forked while batches are appended to the source: the copy holds whole batches only."""
    source = rstore.session("busy")
    await source.add_items([{"w": -1, "b": 0, "k": k} for k in range(3)])

    async def appender(w: int) -> None:
        for b in range(10):
            await source.add_items([{"w": w, "b": b, "k": k} for k in range(3)])

    async def forker() -> list[str]:
        made = []
        for f in range(6):
            await rstore.fork("busy", f"busy-{f}")
            made.append(f"busy-{f}")
            await asyncio.sleep(0)
        return made

    *_, made = await asyncio.gather(*(appender(w) for w in range(3)), forker())
    for name in made:
        items = await rstore.session(name).get_items()
        assert len(items) % 3 == 0
        for start in range(0, len(items), 3):
            chunk = items[start : start + 3]
            assert [i["k"] for i in chunk] == [0, 1, 2]
            assert len({(i["w"], i["b"]) for i in chunk}) == 1


async def test_fork_with_a_corrupt_row(backend: Any, rstore: SessionStore) -> None:
    """A row that is not JSON (written behind the library's back) is copied as it is.

    Counting turns skips it on SQLite and MySQL; Postgres 15 cannot test JSON
    validity, so there ``at_turn`` fails on it (a database error, nothing written).
    """
    source = rstore.session("dirty")
    await source.add_items([{"role": "user", "content": "one"}])
    async with rstore.engine.begin() as conn:
        await raw_rows.append_raw(conn, rstore.table_names, "dirty", "{not json")
    await source.add_items([{"role": "user", "content": "two"}])
    whole = await rstore.fork("dirty", "dirty-all")
    assert await whole.get_items() == [
        {"role": "user", "content": "one"},
        {"role": "user", "content": "two"},
    ]
    info = await rstore.get_session("dirty-all")
    assert info is not None
    assert info.item_count == 3  # the corrupt row too, skipped on read as in the source
    if backend.kind == "postgres":
        with pytest.raises(DBAPIError):
            await rstore.fork("dirty", "dirty-2", at_turn=2)
        assert await rstore.get_session("dirty-2") is None
    else:
        fork = await rstore.fork("dirty", "dirty-2", at_turn=2)
        assert await fork.get_items() == [{"role": "user", "content": "one"}]


async def test_fork_at_turn_racing_replaces_sees_one_history(rstore: SessionStore) -> None:
    """Forks at a turn while the source's history is replaced: each is one history's prefix.

    The cut (where turn N starts) and the copy are two statements; the fork
    keeps the history from changing between them (on Postgres by share-locking
    the source's row), so a fork never comes out empty or mixed.
    """

    def generation(r: int) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        for t in range(3):
            items.append({"role": "user", "content": f"{r}.{t}"})
            items += [{"role": "assistant", "content": f"{r}.{t}.{k}"} for k in range(20)]
        return items

    source = rstore.session("moving")
    await source.replace_items(generation(0))  # type: ignore[arg-type]

    async def replacer() -> None:
        for r in range(1, 12):
            await source.replace_items(generation(r))  # type: ignore[arg-type]

    async def forker() -> list[str]:
        return [(await rstore.fork("moving", f"m{f}", at_turn=2)).session_id for f in range(12)]

    _, made = await asyncio.gather(replacer(), forker())
    for name in made:
        items = await rstore.session(name).get_items()
        assert len(items) == 21, (name, len(items))
        r = items[0]["content"].split(".")[0]
        assert items == generation(int(r))[:21]
