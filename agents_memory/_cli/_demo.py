"""``agents-memory demo``: a realistic conversation through the public API, printed back.

With ``openai-agents`` installed the conversation really runs through the
Agents SDK's ``Runner``: a scripted model (``agents.testing.ScriptedModel``,
no network, no API key) asks for a real function tool, and the Runner stores
every turn in our session. Without it, the same items are written with
``add_items``. Either way the history is then read, limited and popped.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import typer

from agents_memory._cli._render import describe

if TYPE_CHECKING:
    from agents_memory._admin._target import Target
    from agents_memory._sqlalchemy._session import SQLAlchemySession

SESSION_ID = "demo"
QUESTIONS = ["What's the weather in Paris?", "Should I take an umbrella?"]
WEATHER = {"Paris": "18°C, light rain"}
ANSWERS = ["It's 18°C with light rain in Paris.", "Yes — rain is expected all day. ☔"]


def get_weather(city: str) -> str:
    """Current weather for a city (the demo's function tool)."""
    return WEATHER.get(city, "no data for that city")


def _message(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "type": "message", "content": [{"type": "output_text", "text": text}]}


CONVERSATION: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": QUESTIONS[0]}],
    [
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": json.dumps({"city": "Paris"}),
        },
        {"type": "function_call_output", "call_id": "call_1", "output": get_weather("Paris")},
        _message("assistant", ANSWERS[0]),
    ],
    [{"role": "user", "content": QUESTIONS[1]}],
    [_message("assistant", ANSWERS[1])],
]
"""The same conversation as plain items, for when the Agents SDK is not installed."""


async def _through_runner(session: SQLAlchemySession) -> bool:
    """Run the conversation with the Agents SDK's Runner; False if it is not installed."""
    try:
        from agents import Agent, RunConfig, Runner, function_tool  # noqa: PLC0415
        from agents.testing import (  # noqa: PLC0415
            ScriptedModel,
            assistant_message,
            function_call,
        )
    except ImportError:
        return False
    model = ScriptedModel(
        [
            [function_call("get_weather", {"city": "Paris"}, call_id="call_1")],
            [assistant_message(ANSWERS[0])],
            [assistant_message(ANSWERS[1])],
        ]
    )
    agent = Agent(
        name="weather",
        instructions="Answer weather questions briefly; use get_weather.",
        model=model,
        tools=[function_tool(get_weather)],
    )
    config = RunConfig(tracing_disabled=True)  # a demo sends nothing anywhere
    for question in QUESTIONS:
        await Runner.run(agent, question, session=session, run_config=config)
    return True


async def run_demo(target: Target) -> None:
    """Migrate, converse, then read the history back, limited, and popped."""
    from agents_memory._admin._db import upgrade  # noqa: PLC0415 - the CLI's --help needs none
    from agents_memory._admin._target import open_store  # noqa: PLC0415

    typer.echo(f"store: {target}")
    migration = await upgrade(target)
    if migration.before == migration.after:
        typer.echo(f"schema: already at revision {migration.after}")
    else:
        typer.echo(f"schema: migrated from {migration.before or 'nothing'} to {migration.after}")
    async with open_store(target, must_exist=False) as store:
        session = store.session(SESSION_ID)
        await session.clear_session()
        if await _through_runner(session):
            typer.echo("conversation: 2 turns through the Agents SDK Runner (scripted model)")
        else:
            for turn in CONVERSATION:
                await session.add_items(turn)  # type: ignore[arg-type]
            typer.echo("conversation: 4 add_items calls (install openai-agents to use the Runner)")
        items = await session.get_items()
        typer.echo(f"\nsession {SESSION_ID!r} holds {len(items)} items:")
        for n, item in enumerate(items, 1):
            typer.echo(f"  {n}. {describe(item)}")
        typer.echo("\nget_items(limit=2), the latest two, oldest first:")
        for item in await session.get_items(limit=2):
            typer.echo(f"  - {describe(item)}")
        popped = await session.pop_item()
        if popped is not None:
            typer.echo(f"\npop_item() removed the newest: {describe(popped)}")
        typer.echo(f"now {len(await session.get_items())} items remain.")
        typer.echo(f"\nnext: agents-memory sessions show {SESSION_ID}")
