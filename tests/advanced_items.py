"""Items and run results the advanced-session tests share."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from agents.usage import InputTokensDetails, OutputTokensDetails, Usage


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def answer(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "output_text", "text": text}]}


def call(name: str, call_id: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": "{}"}


def output(call_id: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": "ok"}


def run_result(requests: int, input_tokens: int, output_tokens: int) -> Any:
    """What store_run_usage reads of a RunResult: ``context_wrapper.usage``."""
    usage = Usage(
        requests=requests,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=input_tokens + output_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=1, cache_write_tokens=0),
        output_tokens_details=OutputTokensDetails(reasoning_tokens=2),
    )
    return SimpleNamespace(context_wrapper=SimpleNamespace(usage=usage))
