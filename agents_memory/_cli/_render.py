"""One readable line per stored item, whatever Responses-API type it is."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

LABEL_WIDTH = 12
MAX_OTHER = 200
"""Characters shown of an item type we have no special line for."""


def _text(content: object) -> str:
    """The text of a message's or tool output's content (a string or a list of parts)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping):
                text = part.get("text") or part.get("refusal")
                parts.append(str(text) if text is not None else f"[{part.get('type', 'part')}]")
            else:
                parts.append(str(part))
        return " ".join(parts)
    return "" if content is None else json.dumps(content, ensure_ascii=False)


def describe(item: Mapping[str, Any]) -> str:
    """``label  text`` for one item: role and text, or a tool call and its result."""
    kind = item.get("type")
    if kind == "function_call":
        label, text = "tool call", f"{item.get('name')}({item.get('arguments', '')})"
    elif kind == "function_call_output":
        label, text = "tool result", _text(item.get("output"))
    elif kind == "reasoning":
        label, text = "reasoning", _text(item.get("summary"))
    elif "role" in item:
        label, text = str(item["role"]), _text(item.get("content"))
    else:
        raw = json.dumps(item, ensure_ascii=False, separators=(",", ":"))
        label = str(kind or "item")
        text = raw if len(raw) <= MAX_OTHER else raw[: MAX_OTHER - 1] + "…"
    return f"{label:<{LABEL_WIDTH}} {text}"
