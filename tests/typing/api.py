"""The public API as a user writes it, checked by ``mypy --strict`` (never run by pytest)."""

from __future__ import annotations

from agents_memory import (
    Session,
    SessionPage,
    SessionSettings,
    SessionStore,
    SQLAlchemySession,
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
