"""A small stand-in for OpenAI's Conversations API, served over real HTTP on 127.0.0.1.

Tests point the real ``openai.AsyncOpenAI`` client at it (``base_url``), so the
client's request building, pagination and error mapping all run for real. It
implements the endpoints ``OpenAIConversationsSession`` uses, with the
documented list shape (``object``/``data``/``first_id``/``last_id``/``has_more``),
the documented limits (1-100 items per page, at most 20 items per create) and
error bodies (``{"error": {"message", "type", "param", "code"}}``). It records
every request, so tests can assert what was (and was not) sent, and can be told
to fail the next matching requests with a given status.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from local_http import LocalHTTPServer

MAX_ITEMS_PER_CREATE = 20
MAX_PAGE_SIZE = 100
DEFAULT_PAGE_SIZE = 20

_ERROR_TYPES = {
    400: "invalid_request_error",
    404: "invalid_request_error",
    429: "rate_limit_exceeded",
    500: "server_error",
}
_ID_PREFIX = {"message": "msg", "reasoning": "rs", "function_call": "fc"}


@dataclasses.dataclass(frozen=True)
class Request:
    """One request the server received (path without the ``/v1`` prefix)."""

    method: str
    path: str
    query: dict[str, str]
    body: Any


@dataclasses.dataclass
class Fault:
    """Fail the next ``times`` requests with ``method`` and a ``path`` matching, with ``status``."""

    method: str
    path: str
    status: int
    times: int
    message: str
    headers: dict[str, str]
    applied: bool = False
    """Carry the request out, then answer with the error (as when the answer is lost)."""


class ApiError(Exception):
    """An error response, in the API's error body shape."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = {
            "error": {
                "message": message,
                "type": _ERROR_TYPES.get(status, "invalid_request_error"),
                "param": param,
                "code": code,
            }
        }


def _stored(item: Any, index: int) -> dict[str, Any]:
    """Validate one input item as the API does and return it as stored (with an id)."""
    if not isinstance(item, dict):
        raise ApiError(400, f"Invalid type for 'items[{index}]'", param=f"items[{index}]")
    kind = item.get("type", "message" if "role" in item else None)
    if kind is None:
        raise ApiError(400, f"Missing required parameter: 'items[{index}].type'", param="items")
    if kind == "reasoning" and not item.get("id") and not item.get("encrypted_content"):
        raise ApiError(400, "Invalid item", param="item", code="invalid_item")
    stored = {"type": kind, **item}
    if kind == "message" and isinstance(item.get("content"), str):
        # Stored as a Message: text content becomes one content part, as the API does.
        part = "output_text" if item.get("role") == "assistant" else "input_text"
        stored["content"] = [{"type": part, "text": item["content"]}]
    stored.setdefault("id", f"{_ID_PREFIX.get(kind, 'item')}_{uuid.uuid4().hex}")
    return stored


class FakeConversationsServer(LocalHTTPServer):
    """The Conversations API endpoints, in memory, on a free port of 127.0.0.1."""

    def __init__(self) -> None:
        self.conversations: dict[str, list[dict[str, Any]]] = {}
        self.requests: list[Request] = []
        self.create_delay = 0.0
        """Seconds ``POST /conversations`` waits before answering (widens race windows)."""
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        super().__init__(_handler_for(self))

    # -- what tests use -------------------------------------------------------------------------

    def fail(
        self,
        method: str,
        path: str,
        status: int,
        *,
        times: int = 1,
        message: str = "injected failure",
        headers: dict[str, str] | None = None,
        applied: bool = False,
    ) -> None:
        """Answer the next ``times`` matching requests with ``status``.

        With nothing done; or, ``applied``, after doing what they asked, as a
        gateway whose upstream answered too late.
        """
        with self._lock:
            self._faults.append(Fault(method, path, status, times, message, headers or {}, applied))

    def requests_matching(self, method: str, path: str = ".*") -> list[Request]:
        """The requests received so far with this method and a path matching the regex."""
        with self._lock:
            return [r for r in self.requests if r.method == method and re.fullmatch(path, r.path)]

    def items(self, conversation_id: str) -> list[dict[str, Any]]:
        """A copy of what the server stores for a conversation."""
        with self._lock:
            return [dict(item) for item in self.conversations[conversation_id]]

    def add_conversation(self, items: list[dict[str, Any]]) -> str:
        """Create a conversation directly (as another client would) and return its id."""
        with self._lock:
            conversation_id = f"conv_{uuid.uuid4().hex}"
            self.conversations[conversation_id] = [_stored(i, n) for n, i in enumerate(items)]
            return conversation_id

    # -- the API --------------------------------------------------------------------------------

    def handle(
        self, method: str, path: str, query: dict[str, str], body: Any
    ) -> tuple[int, Any, dict[str, str]]:
        """Answer one request: (status, JSON body, extra headers)."""
        path = path.removeprefix("/v1")
        with self._lock:
            self.requests.append(Request(method, path, query, body))
            fault = self._take_fault(method, path)
        if fault is not None:
            if fault.applied:
                with self._lock, contextlib.suppress(ApiError):
                    self._route(method, path, query, body)
            error = ApiError(fault.status, fault.message)
            return fault.status, error.body, fault.headers
        if method == "POST" and path == "/conversations" and self.create_delay:
            time.sleep(self.create_delay)
        try:
            with self._lock:
                return 200, self._route(method, path, query, body), {}
        except ApiError as exc:
            return exc.status, exc.body, {}

    def _take_fault(self, method: str, path: str) -> Fault | None:
        for fault in self._faults:
            if fault.method == method and re.fullmatch(fault.path, path):
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
                return fault
        return None

    def _route(self, method: str, path: str, query: dict[str, str], body: Any) -> Any:
        for route_method, pattern, handler in _ROUTES:
            match = re.fullmatch(pattern, path)
            if match is None or route_method != method:
                continue
            ids = match.groupdict()
            conversation_id = ids.get("conversation_id")
            if conversation_id is not None and conversation_id not in self.conversations:
                raise ApiError(404, f"Conversation with id '{conversation_id}' not found.")
            return handler(self, body=body, query=query, **ids)
        raise ApiError(404, f"Invalid URL ({method} {path})")

    @staticmethod
    def _conversation(conversation_id: str) -> dict[str, Any]:
        return {"id": conversation_id, "object": "conversation", "created_at": 0, "metadata": {}}

    @staticmethod
    def _validated(items: Any) -> list[dict[str, Any]]:
        if not isinstance(items, list):
            raise ApiError(400, "Invalid type for 'items': expected an array.", param="items")
        if len(items) > MAX_ITEMS_PER_CREATE:
            raise ApiError(
                400,
                f"Invalid 'items': array too long. Expected an array with maximum length "
                f"{MAX_ITEMS_PER_CREATE}, but got an array with length {len(items)} instead.",
                param="items",
                code="array_above_max_length",
            )
        return [_stored(item, i) for i, item in enumerate(items)]

    def _create_conversation(self, *, body: Any, **_: Any) -> dict[str, Any]:
        items = self._validated((body or {}).get("items") or [])
        conversation_id = f"conv_{uuid.uuid4().hex}"
        self.conversations[conversation_id] = items
        return self._conversation(conversation_id)

    def _get_conversation(self, *, conversation_id: str, **_: Any) -> dict[str, Any]:
        return self._conversation(conversation_id)

    def _delete_conversation(self, *, conversation_id: str, **_: Any) -> dict[str, Any]:
        del self.conversations[conversation_id]
        return {"id": conversation_id, "object": "conversation.deleted", "deleted": True}

    def _create_items(self, *, conversation_id: str, body: Any, **_: Any) -> dict[str, Any]:
        items = self._validated((body or {}).get("items"))
        self.conversations[conversation_id].extend(items)
        return self._page(items, has_more=False)

    @staticmethod
    def _page(data: list[dict[str, Any]], *, has_more: bool) -> dict[str, Any]:
        return {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": has_more,
        }

    def _list_items(
        self, *, conversation_id: str, query: dict[str, str], **_: Any
    ) -> dict[str, Any]:
        try:
            limit = int(query.get("limit", DEFAULT_PAGE_SIZE))
        except ValueError:
            raise ApiError(400, "Invalid 'limit': expected an integer.", param="limit") from None
        if not 1 <= limit <= MAX_PAGE_SIZE:
            raise ApiError(
                400,
                f"Invalid 'limit': integer below minimum value (1) or above maximum value "
                f"({MAX_PAGE_SIZE}), got {limit}.",
                param="limit",
            )
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise ApiError(400, f"Invalid 'order': {order!r}.", param="order")
        items = self.conversations[conversation_id]
        ordered = items if order == "asc" else items[::-1]
        start = 0
        if "after" in query:
            ids = [item["id"] for item in ordered]
            if query["after"] not in ids:
                raise ApiError(400, f"Invalid 'after': no item {query['after']!r}.", param="after")
            start = ids.index(query["after"]) + 1
        data = ordered[start : start + limit]
        return self._page(data, has_more=start + limit < len(ordered))

    def _delete_item(self, *, conversation_id: str, item_id: str, **_: Any) -> dict[str, Any]:
        items = self.conversations[conversation_id]
        for i, item in enumerate(items):
            if item["id"] == item_id:
                del items[i]
                return self._conversation(conversation_id)
        raise ApiError(404, f"Item with id '{item_id}' not found.")


_CONVERSATION = r"/conversations/(?P<conversation_id>[^/]+)"
_ROUTES: list[tuple[str, str, Callable[..., Any]]] = [
    ("POST", r"/conversations", FakeConversationsServer._create_conversation),
    ("GET", _CONVERSATION, FakeConversationsServer._get_conversation),
    ("DELETE", _CONVERSATION, FakeConversationsServer._delete_conversation),
    ("POST", _CONVERSATION + "/items", FakeConversationsServer._create_items),
    ("GET", _CONVERSATION + "/items", FakeConversationsServer._list_items),
    ("DELETE", _CONVERSATION + r"/items/(?P<item_id>[^/]+)", FakeConversationsServer._delete_item),
]


def _handler_for(server: FakeConversationsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects
        disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms stalls

        def _serve(self) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                error = ApiError(400, "We could not parse the JSON body of your request.")
                status, payload, headers = 400, error.body, {}
            else:
                status, payload, headers = server.handle(
                    self.command, url.path, dict(parse_qsl(url.query)), body
                )
            data = json.dumps(payload).encode()
            self.send_response(status, HTTPStatus(status).phrase)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_DELETE = _serve  # noqa: N815

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            """Keep test output quiet."""

    return Handler
