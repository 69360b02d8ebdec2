"""The issue's four lines: our sessions passed to the Agents SDK, under ``mypy --strict``.

Checked by the repository's mypy configuration (``files`` includes ``tests/typing``) with
no ignore comment; never run by pytest.
"""

from __future__ import annotations

import agents
from agents import Agent, RunConfig, Runner
from agents.extensions.memory import EncryptedSession

import agents_memory
from agents_memory import OpenAIConversationsSession, SessionStore, SQLiteSession


async def run(agent: Agent[None], store: SessionStore) -> None:
    s: agents.Session = store.session("u")
    await Runner.run(agent, "hi", session=store.session("u"))
    await Runner.run(agent, "hi", session=SQLiteSession("u"))
    await Runner.run(agent, "hi", session=OpenAIConversationsSession())
    assert s.session_id == "u"


async def settings(agent: Agent[None]) -> None:
    ours: agents_memory.SessionSettings = agents.SessionSettings(limit=2)
    sdk: agents.SessionSettings = agents_memory.SessionSettings(limit=2)
    await Runner.run(
        agent, "hi", session=SQLiteSession("u"), run_config=RunConfig(session_settings=ours)
    )
    session = SQLiteSession("u", session_settings={"limit": 2})
    session.session_settings = sdk
    wrapped = EncryptedSession(session_id="u", underlying_session=session, encryption_key="k")
    await Runner.run(agent, "hi", session=wrapped)
