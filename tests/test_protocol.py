"""The protocol types are the Agents SDK's own, loaded only when asked for."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from pathlib import Path

import agents
import pytest
from agents.memory import SessionABC as SdkSessionABC

import agents_memory
from agents_memory import (
    OpenAIConversationsSession,
    Session,
    SessionABC,
    SessionSettings,
    SQLAlchemySession,
    SQLiteSession,
    TResponseInputItem,
)


def test_types_are_the_sdks() -> None:
    """Session, SessionABC, SessionSettings and TResponseInputItem are the SDK's objects."""
    assert Session is agents.Session
    assert SessionABC is agents.SessionABC
    assert SessionSettings is agents.SessionSettings
    assert TResponseInputItem is agents.TResponseInputItem


def test_our_classes_count_as_the_sdks() -> None:
    """Each class is a (virtual) subclass of the SDK's SessionABC; ours of its Conversations."""
    for cls in (SQLAlchemySession, SQLiteSession, OpenAIConversationsSession):
        assert issubclass(cls, SdkSessionABC), cls
    assert issubclass(OpenAIConversationsSession, agents.OpenAIConversationsSession)
    assert not issubclass(SQLiteSession, agents.OpenAIConversationsSession)
    with SQLiteSession("s") as s:
        assert isinstance(s, Session)
        assert isinstance(s, SdkSessionABC)
        assert s.session_settings is None


def test_settings_keep_the_sdks_semantics() -> None:
    """resolve() and to_dict() are the SDK's; a dict override only sets its own keys."""
    base = SessionSettings(limit=5)
    assert base.resolve(None) is base
    assert base.resolve({"limit": 2}).limit == 2
    assert base.resolve(SessionSettings()).limit == 5
    assert base.to_dict() == {"limit": 5}


@pytest.mark.parametrize("bad", [-1, True])
def test_a_bad_settings_limit_fails_on_read(bad: object) -> None:
    """A limit the SDK's class lets through (negative, bool) is refused on the first read."""
    settings = SessionSettings()
    settings.limit = bad  # type: ignore[assignment]
    with SQLiteSession("s", session_settings=settings) as s, pytest.raises((ValueError, TypeError)):
        asyncio.run(s.get_items())


def test_importing_and_using_sqlite_session_loads_no_sdk(tmp_path: Path) -> None:
    """Importing and using SQLiteSession loads no SDK, openai, aiosqlite or CLI stack."""
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from agents_memory import SQLiteSession
        async def main():
            with SQLiteSession("u", {str(tmp_path / "light.db")!r}) as s:
                await s.add_items([{{"role": "user", "content": "hi"}}])
                assert await s.get_items() == [{{"role": "user", "content": "hi"}}]
        asyncio.run(main())
        heavy = ("agents", "openai", "aiosqlite", "typer", "rich", "asyncmy")
        print(sorted(m for m in heavy if m in sys.modules))
        """
    )
    out = subprocess.run(  # noqa: S603 - a fixed interpreter and script
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stderr


def test_public_api_is_exported() -> None:
    """Everything in __all__ exists, and the version comes from the package metadata."""
    for name in agents_memory.__all__:
        assert hasattr(agents_memory, name), name
    assert agents_memory.__version__ != "0.0.0"
    assert Session is agents_memory.Session
