"""Realistic Responses-API input items, 200-1,500 bytes of JSON each, generated deterministically.

A conversation turn is what an agent run appends: the user's message, a tool call, the
tool's output and the assistant's answer. Sizes and a sprinkling of non-ASCII text are
drawn from a seeded RNG, so every implementation stores byte-identical data.
"""

from __future__ import annotations

import json
import random
from typing import Any

MIN_BYTES = 200
MAX_BYTES = 1500

_WORDS = (
    "the",
    "order",
    "shipped",
    "from",
    "Lyon",
    "on",
    "Tuesday",
    "and",
    "should",
    "arrive",
    "within",
    "three",
    "business",
    "days",
    "please",
    "confirm",
    "the",
    "delivery",
    "address",
    "café",
    "naïve",
    "東京",
    "résumé",
    "weather",
    "forecast",
    "shows",
    "rain",
    "I",
    "checked",
    "the",
    "account",
    "and",
    "found",
    "two",
    "pending",
    "invoices",
    "the",
    "refund",
    "was",
    "approved",
    "🚚",
    "customer",
    "asked",
    "about",
    "the",
    "warranty",
    "policy",
    "for",
    "refurbished",
    "laptops",
    "and",
    "accessories",
)


def _text(rng: random.Random, n_bytes: int) -> str:
    words: list[str] = []
    size = 0
    while size < n_bytes:
        w = rng.choice(_WORDS)
        words.append(w)
        size += len(w.encode()) + 1
    return " ".join(words)


def _sized(build: Any, rng: random.Random) -> dict[str, Any]:
    """Build an item whose compact JSON lands between MIN_BYTES and MAX_BYTES."""
    target = rng.randint(MIN_BYTES + 10, MAX_BYTES - 40)  # the last word may overshoot
    empty = len(json.dumps(build(""), ensure_ascii=False, separators=(",", ":")).encode())
    item: dict[str, Any] = build(_text(rng, max(target - empty, 10)))
    size = len(json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode())
    if not MIN_BYTES <= size <= MAX_BYTES:  # pragma: no cover - guards the generator itself
        msg = f"generated item of {size} bytes"
        raise AssertionError(msg)
    return item


def turn(rng: random.Random, n: int) -> list[dict[str, Any]]:
    """One agent turn of four items: user message, function call, its output, assistant reply."""
    call_id = f"call_{rng.getrandbits(96):024x}"
    return [
        _sized(lambda t: {"role": "user", "content": t}, rng),
        _sized(
            lambda t: {
                "type": "function_call",
                "id": f"fc_{rng.getrandbits(128):032x}",
                "call_id": call_id,
                "name": "lookup_order",
                "arguments": json.dumps({"order_id": n, "query": t}, ensure_ascii=False),
                "status": "completed",
            },
            rng,
        ),
        _sized(
            lambda t: {
                "type": "function_call_output",
                "call_id": call_id,
                "output": json.dumps({"status": "ok", "order": n, "notes": t}, ensure_ascii=False),
            },
            rng,
        ),
        _sized(
            lambda t: {
                "id": f"msg_{rng.getrandbits(128):032x}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": t, "annotations": []}],
            },
            rng,
        ),
    ]


class ItemSource:
    """A fixed pool of turns, cycled: cheap to draw from, identical for every implementation."""

    def __init__(self, turns: int = 256, seed: int = 6) -> None:
        rng = random.Random(seed)
        self._turns = [turn(rng, n) for n in range(turns)]
        self._next = 0

    def turn(self) -> list[dict[str, Any]]:
        """The next turn's four items."""
        t = self._turns[self._next % len(self._turns)]
        self._next += 1
        return t

    def items(self, n: int) -> list[dict[str, Any]]:
        """``n`` items in turn order."""
        out: list[dict[str, Any]] = []
        while len(out) < n:
            out.extend(self.turn())
        return out[:n]

    def mean_bytes(self) -> float:
        """Average encoded size of the pool's items."""
        sizes = [
            len(json.dumps(i, ensure_ascii=False, separators=(",", ":")).encode())
            for t in self._turns
            for i in t
        ]
        return sum(sizes) / len(sizes)
