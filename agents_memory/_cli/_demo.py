"""``agents-memory demo``: a realistic conversation through the public API, printed back."""

from __future__ import annotations

import json
from typing import Any

import typer

from agents_memory import SessionStore, TResponseInputItem
from agents_memory._urls import mask_url

CONVERSATION: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "What's the weather in Paris?"}],
    [
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": json.dumps({"city": "Paris"}),
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "18°C, light rain"},
        {
            "role": "assistant",
            "type": "message",
            "content": [{"type": "output_text", "text": "It's 18°C with light rain in Paris."}],
        },
    ],
    [{"role": "user", "content": "Should I take an umbrella?"}],
    [
        {
            "role": "assistant",
            "type": "message",
            "content": [{"type": "output_text", "text": "Yes — rain is expected all day. ☔"}],
        }
    ],
]


def describe(item: TResponseInputItem) -> str:
    """One readable line for an item of any Responses-API type."""
    data: dict[str, Any] = dict(item)
    kind = data.get("type", "message")
    if kind == "function_call":
        return f"tool call    {data['name']}({data['arguments']})"
    if kind == "function_call_output":
        return f"tool result  {data['output']}"
    content = data.get("content")
    if isinstance(content, list):
        content = " ".join(str(part.get("text", "")) for part in content)
    return f"{data.get('role', kind):<12} {content}"


async def run_demo(url: str) -> None:
    """Write the conversation turn by turn, then read, limit and pop it back."""
    typer.echo(f"database: {mask_url(url)}")
    async with SessionStore.from_url(url, create_tables=True) as store:
        session = store.session("demo")
        await session.clear_session()
        for turn in CONVERSATION:
            await session.add_items(turn)  # type: ignore[arg-type]
        items = await session.get_items()
        typer.echo(f"\nsession 'demo' holds {len(items)} items:")
        for n, item in enumerate(items, 1):
            typer.echo(f"  {n}. {describe(item)}")
        typer.echo("\nget_items(limit=2), the latest two, oldest first:")
        for item in await session.get_items(limit=2):
            typer.echo(f"  - {describe(item)}")
        popped = await session.pop_item()
        if popped is not None:
            typer.echo(f"\npop_item() removed the newest: {describe(popped)}")
        typer.echo(f"now {len(await session.get_items())} items remain.")
