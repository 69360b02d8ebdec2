"""The real Agents SDK Runner, with a scripted model, keeps history in our session."""

from __future__ import annotations

import agents
import pytest
from agents import testing

from agents_memory import SessionStore

pytestmark = pytest.mark.integration


def _texts(call_input: object) -> list[str]:
    """All text content of a model call's input, whatever shape its items have."""
    out: list[str] = []
    for item in call_input if isinstance(call_input, list) else [call_input]:
        content = item.get("content") if isinstance(item, dict) else item
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out += [str(part.get("text", "")) for part in content if isinstance(part, dict)]
    return out


async def test_runner_second_turn_sees_first(store: SessionStore) -> None:
    """Over two turns, the second model call receives the first turn's question and answer."""
    model = testing.ScriptedModel(
        [
            [testing.assistant_message("Paris is the capital of France.")],
            [testing.assistant_message("About 2.1 million people.")],
        ]
    )
    agent = agents.Agent(name="geo", instructions="Answer briefly.", model=model)
    session = store.session("runner")

    first = await agents.Runner.run(agent, "What is the capital of France?", session=session)
    assert first.final_output == "Paris is the capital of France."
    second = await agents.Runner.run(agent, "How many people live there?", session=session)
    assert second.final_output == "About 2.1 million people."

    seen = _texts(model.calls[1].input)
    assert "What is the capital of France?" in seen
    assert "Paris is the capital of France." in seen
    assert "How many people live there?" in seen
    stored = _texts(await session.get_items())
    assert stored == [
        "What is the capital of France?",
        "Paris is the capital of France.",
        "How many people live there?",
        "About 2.1 million people.",
    ]
