"""A small stand-in for OpenAI's ``POST /v1/responses/compact``, served over real HTTP on 127.0.0.1.

Tests point the real ``openai.AsyncOpenAI`` client at it (``base_url``), so the
client's request building and response parsing (``CompactedResponse``) run for
real, as the SDK's ``OpenAIResponsesCompactionSession`` calls them. The answer
is what the API documents: ``object: "response.compaction"``, an ``output`` list
(here: one user message summing up the input, and one opaque ``compaction``
item), and ``usage``. Every request body is recorded; ``delay`` holds the answer
back, so tests can read the session while the compaction is in flight.
"""

from __future__ import annotations

import json
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any

from local_http import LocalHTTPServer


class FakeCompactServer(LocalHTTPServer):
    """``POST /v1/responses/compact`` on a free port of 127.0.0.1."""

    def __init__(self) -> None:
        self.requests: list[Any] = []
        self.delay = 0.0
        """Seconds the server waits before answering."""
        self._lock = threading.Lock()
        super().__init__(_handler_for(self))

    def compact(self, body: Any) -> tuple[int, Any]:
        """The endpoint: a summary of the input items as the compacted output."""
        with self._lock:
            self.requests.append(body)
            number = len(self.requests)
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            return 400, {"error": {"message": "model is required", "type": "invalid_request"}}
        items = body.get("input") or []
        if time_to_wait := self.delay:
            time.sleep(time_to_wait)
        summary = {
            "id": f"msg_{number}",
            "type": "message",
            "role": "user",
            "status": "completed",
            "content": [{"type": "input_text", "text": f"summary #{number} of {len(items)} items"}],
        }
        compaction = {
            "id": f"cmp_{number}",
            "type": "compaction",
            "encrypted_content": f"opaque-{number}-{len(items)}",
        }
        return 200, {
            "id": f"resp_cmp_{number}",
            "object": "response.compaction",
            "created_at": int(time.time()),
            "output": [summary, compaction],
            "usage": {
                "input_tokens": 10 * len(items),
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": 7,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 10 * len(items) + 7,
            },
        }


def _handler_for(server: FakeCompactServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects
        disable_nagle_algorithm = True

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if self.path.split("?")[0] != "/v1/responses/compact":
                status, payload = 404, {"error": {"message": "not found", "type": "invalid"}}
            else:
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    status, payload = 400, {"error": {"message": "bad JSON", "type": "invalid"}}
                else:
                    status, payload = server.compact(body)
            data = json.dumps(payload).encode()
            self.send_response(status, HTTPStatus(status).phrase)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            """Keep test output quiet."""

    return Handler
