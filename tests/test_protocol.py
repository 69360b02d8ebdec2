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
    """Importing and using SQLiteSession loads no SDK, openai, aiosqlite, Alembic or CLI stack."""
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        from agents_memory import SQLiteSession
        async def main():
            with SQLiteSession("u", {str(tmp_path / "light.db")!r}) as s:
                await s.add_items([{{"role": "user", "content": "hi"}}])
                assert await s.get_items() == [{{"role": "user", "content": "hi"}}]
        asyncio.run(main())
        heavy = ("agents", "openai", "aiosqlite", "alembic", "typer", "rich", "asyncmy")
        print(sorted(m for m in heavy if m in sys.modules))
        """
    )
    out = subprocess.run(  # noqa: S603 - a fixed interpreter and script
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stderr


def _loaded_after(code: str) -> str:
    script = code + textwrap.dedent(
        """
        import sys
        heavy = ("sqlalchemy", "alembic", "agents", "openai", "aiosqlite", "asyncpg", "asyncmy")
        print(sorted(m for m in heavy if m in sys.modules))
        """
    )
    out = subprocess.run(  # noqa: S603 - a fixed interpreter and script
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    return out.stdout.strip().splitlines()[-1]


def test_importing_the_package_loads_no_database_stack() -> None:
    """``import agents_memory`` loads nothing heavy; each public name loads its own module."""
    assert _loaded_after("import agents_memory") == "[]"
    assert _loaded_after("import agents_memory; agents_memory.TableNames") == "[]"
    loaded = _loaded_after("from agents_memory import SessionStore")
    assert "'sqlalchemy'" in loaded
    for heavy in ("alembic", "agents", "openai"):
        assert f"'{heavy}'" not in loaded, heavy


def test_cli_help_loads_no_database_stack() -> None:
    """``agents-memory --help`` (and a command's help) needs neither SQLAlchemy nor Alembic."""
    for argv in (["agents-memory", "--help"], ["agents-memory", "sessions", "list", "--help"]):
        code = (
            f"import sys; sys.argv = {argv!r}\n"
            "from agents_memory._cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
        )
        assert _loaded_after(code) == "[]", argv


def test_classes_loaded_after_the_sdk_are_its_session_subclasses() -> None:
    """The SDK imported first, our classes loaded later (lazily): still ``SessionABC``."""
    code = textwrap.dedent(
        """
        import agents
        from agents_memory import SQLiteSession, SQLAlchemySession
        assert issubclass(SQLiteSession, agents.memory.SessionABC)
        assert issubclass(SQLAlchemySession, agents.memory.SessionABC)
        """
    )
    assert "agents" in _loaded_after(code)


def test_models_name_the_head_revision() -> None:
    """``models.REVISION`` (what SQLiteSession stamps) is the scripts' head."""
    assert agents_memory.migrations.head() == agents_memory.models.REVISION


def test_public_api_is_exported() -> None:
    """Everything in __all__ exists, and the version comes from the package metadata."""
    for name in agents_memory.__all__:
        assert hasattr(agents_memory, name), name
    assert agents_memory.__version__ != "0.0.0"
    assert Session is agents_memory.Session
