"""The public API as a user writes it, checked by ``mypy --strict`` (never run by pytest)."""

from __future__ import annotations

from pathlib import Path

from openai import AsyncOpenAI

from agents_memory import (
    OpenAIConversationsSession,
    Session,
    SessionNotStartedError,
    SessionPage,
    SessionSettings,
    SessionStore,
    SQLAlchemySession,
    SQLiteSession,
    TResponseInputItem,
)


async def use_store() -> None:
    async with SessionStore.from_url("sqlite:///app.db", create_tables=True) as store:
        session: Session = store.session("user-1", session_settings=SessionSettings(limit=20))
        item: TResponseInputItem = {"role": "user", "content": "hi"}
        await session.add_items([item])
        items: list[TResponseInputItem] = await session.get_items(limit=5)
        popped: TResponseInputItem | None = await session.pop_item()
        page: SessionPage = await store.list_sessions(limit=10)
        assert items is not None or popped is None or page.next_cursor is None


async def use_session() -> None:
    session = SQLAlchemySession.from_url("u", url="postgresql://localhost/app")
    async with session:
        async for item in session.iter_items(batch_size=100):
            assert isinstance(item, dict)


async def use_sqlite_session() -> None:
    with SQLiteSession("u", Path("memory.db"), session_settings=SessionSettings(limit=5)) as s:
        session: Session = s
        await session.add_items([{"role": "user", "content": "hi"}])
        items: list[TResponseInputItem] = await session.get_items()
        assert items is not None
    async with SQLiteSession("u") as in_memory:
        assert await in_memory.pop_item() is None


async def use_conversations_session(client: AsyncOpenAI) -> None:
    async with OpenAIConversationsSession(openai_client=client) as conversation:
        session: Session = conversation
        try:
            conversation_id: str = session.session_id
        except SessionNotStartedError:
            await session.add_items([{"role": "user", "content": "hi"}])
            conversation_id = session.session_id
        assert conversation_id
        started: str | None = conversation.conversation_id
        assert started is not None


async def use_replace_and_fork() -> None:
    async with SessionStore.from_url("sqlite:///app.db", create_tables=True) as store:
        item: TResponseInputItem = {"role": "user", "content": "summary"}
        await store.session("user-1").replace_items([item])
        forked: SQLAlchemySession = await store.fork("user-1", "user-1b", at_turn=2)
        await forked.replace_items([])
        with SQLiteSession("u", "app.db") as lite:
            await lite.replace_items([item])
