"""One readable line per stored item, whatever Responses-API type it is."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

LABEL_WIDTH = 12
MAX_OTHER = 200
"""Characters shown of an item type we have no special line for."""
MAX_TEXT = 1000
"""Characters shown of one item's text in a transcript (``--full``: all of it)."""


def shown_id(session_id: str) -> str:
    """A session id as a listing shows it: quoted when it could pass for another id.

    Spaces at its ends or control characters would make ``"a"`` and ``"a "``
    (two sessions) look alike.
    """
    if session_id != session_id.strip() or not session_id.isprintable():
        return repr(session_id)
    return session_id


def _cut(text: str, limit: int | None) -> str:
    if limit is None or len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit:,} more characters; --full shows all]"


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


def describe(item: Mapping[str, Any], *, limit: int | None = MAX_TEXT) -> str:
    """``label  text`` for one item: role and text, or a tool call and its result.

    The text stops after ``limit`` characters with a marker saying how much is
    left, so a 1 MB item does not flood the terminal (``None``: never cut).
    """
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
    return f"{label:<{LABEL_WIDTH}} {_cut(text, limit)}"
