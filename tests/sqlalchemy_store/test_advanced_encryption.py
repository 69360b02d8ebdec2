"""Advanced sessions on an encrypted store, and their branch-aware ``replace_items``, everywhere.

Every write path seals (appends, replace; a branch copies structure rows only),
reads open, the content search runs on the opened text (accents, CJK, emoji), and
no delete (pop, clear, delete_branch, replace) removes a row the keyring cannot open.
"""

from __future__ import annotations

from typing import Any

import pytest
from advanced_items import answer, call, output, user
from encrypted_stores import store_on
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from agents_memory import (
    AdvancedSQLAlchemySession,
    DecryptionError,
    Keyring,
    MissingKeyError,
    SessionStore,
    TableNames,
    get_models,
)

KEY = Keyring.generate_key()
OTHER = Keyring.generate_key()


async def raw(engine: AsyncEngine, names: TableNames) -> list[str]:
    m = get_models(names).Message.__table__
    async with engine.connect() as conn:
        return [str(r) for r in (await conn.execute(select(m.c.message_data))).scalars()]


async def structure_rows(engine: AsyncEngine, names: TableNames) -> int:
    s = get_models(names).Structure.__table__
    async with engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(s))).scalar_one())


async def turns(s: AdvancedSQLAlchemySession) -> None:
    await s.add_items([user("Hello Grüße aus Köln 😀"), answer("Grüße!")])
    await s.add_items([user("中文 問題 with 100% _wild_ chars"), call("f", "c1"), output("c1")])
    await s.add_items([user("plain ascii HELLO"), answer("ok")])


async def test_everything_sealed_and_opened(engine: AsyncEngine, names: TableNames) -> None:
    """Round trip, turns, search and branches over rows that are all envelopes."""
    store = store_on(engine, names, Keyring({"k": KEY}, current="k"))
    try:
        s = store.advanced_session("e")
        await turns(s)
        rows = await raw(engine, names)
        assert len(rows) == 7
        assert all(r.startswith("am1:") for r in rows)
        assert not any("Köln" in r or "HELLO" in r for r in rows)
        items = await s.get_items()
        assert items[0] == user("Hello Grüße aus Köln 😀")
        assert len(items) == 7
        assert [t["full_content"] for t in await s.get_conversation_turns()][1] == (
            "中文 問題 with 100% _wild_ chars"
        )
        assert await s.find_turns_by_content("grÜße") == []  # as on a plaintext store
        assert [t["turn"] for t in await s.find_turns_by_content("grüße")] == [1]
        assert [t["turn"] for t in await s.find_turns_by_content("😀")] == [1]
        assert [t["turn"] for t in await s.find_turns_by_content("問題")] == [2]
        assert [t["turn"] for t in await s.find_turns_by_content("100% _")] == [2]
        assert [t["turn"] for t in await s.find_turns_by_content("hello")] == [1, 3]
        assert await s.get_tool_usage() == [("f", 1, 2)]
        branch = await s.create_branch_from_content("問題", "b")
        assert branch == "b"
        assert len(await raw(engine, names)) == 7  # a branch copies structure rows, not items
        await s.add_items([user("on b, naïve")])
        assert all(r.startswith("am1:") for r in await raw(engine, names))
        assert await s.pop_item() == user("on b, naïve")
        await s.replace_items([user("replaced on b"), answer("fine")])
        assert all(r.startswith("am1:") for r in await raw(engine, names))
        assert await s.get_items() == [user("replaced on b"), answer("fine")]
        await s.switch_to_branch("main")
        assert await s.get_items() == items  # main keeps all it had
        await s.delete_branch("b")
        assert len(await raw(engine, names)) == 7
        # the store's plain session view reads them too
        assert await store.session("e").get_items() == items
    finally:
        await store.close()


async def test_no_delete_removes_what_the_keyring_cannot_open(
    engine: AsyncEngine, names: TableNames
) -> None:
    """A wrong key or no keyring: pop, clear, delete_branch and replace refuse; nothing changes."""
    writer = store_on(engine, names, Keyring({"k": KEY}, current="k"))
    wrong = store_on(engine, names, Keyring({"k": OTHER}, current="k"))
    plain = store_on(engine, names, None)
    try:
        s = writer.advanced_session("e")
        await turns(s)
        await s.create_branch_from_turn(3, "b")
        await s.add_items([user("only on b")])
        before_rows, before_structure = (
            await raw(engine, names),
            await structure_rows(engine, names),
        )
        for other in (wrong, plain):
            o = other.advanced_session("e")
            with pytest.raises(DecryptionError):
                await o.get_items()
            with pytest.raises(DecryptionError):
                await o.find_turns_by_content("x")
            with pytest.raises(DecryptionError):
                await o.pop_item()
            with pytest.raises(DecryptionError):
                await o.clear_session()
            with pytest.raises(DecryptionError):
                await o.replace_items([user("x")])
            await o.switch_to_branch("b")
            await o.switch_to_branch("main")
            with pytest.raises(DecryptionError):
                await o.delete_branch("b")
            assert await raw(engine, names) == before_rows
            assert await structure_rows(engine, names) == before_structure
        with pytest.raises(MissingKeyError):
            await plain.advanced_session("e").get_items()
        assert len(await s.get_items()) == 6  # on b: turns 1-2 and its own item
        s2 = writer.advanced_session("e")
        await s2.delete_branch("b")  # the right key deletes
        assert len(await raw(engine, names)) == 7
    finally:
        for st in (writer, wrong, plain):
            await st.close()


async def test_replace_items_swaps_the_current_branch_only(store: SessionStore) -> None:
    """Plaintext too: the branch's turns restart at 1; what main shares with it stays for main."""
    s = store.advanced_session("r")
    await turns(s)
    await s.store_run_usage(_usage())
    await s.create_branch_from_turn(3, "b")  # shares turns 1-2 with main
    await s.replace_items([user("new first"), answer("new answer"), user("new second")])
    assert await s.get_items() == [user("new first"), answer("new answer"), user("new second")]
    assert [t["turn"] for t in await s.get_conversation_turns()] == [1, 2]
    await s.switch_to_branch("main")
    assert len(await s.get_items()) == 7
    assert await s.get_turn_usage(3) != {}  # main's usage kept
    await s.replace_items([])
    assert await s.get_items() == []
    assert await s.get_turn_usage() == []
    await s.switch_to_branch("b")
    assert len(await s.get_items()) == 3
    assert await s._atomic_replace_items([user("via hook")]) is True
    assert await s.get_items() == [user("via hook")]


def _usage() -> Any:
    from advanced_items import run_result  # noqa: PLC0415

    return run_result(1, 10, 2)
