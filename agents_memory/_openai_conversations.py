"""``OpenAIConversationsSession``: a conversation's history kept by OpenAI's Conversations API.

The Agents SDK's class of the same name, with the gaps closed: the conversation
is created once even when the first calls race, the create call carries the
first items (one request, not two), reads page at most 100 items at a time and
stop as soon as a limit is met, writes go in the API's batches of 20, and items
the API refuses as input are dropped (with a log line) instead of failing the
whole write.

Our only state is the conversation id. It changes only after the request that
justifies it succeeded, so an API error (which reaches the caller as the
``openai`` library's exception) never leaves the session pointing at a
conversation that does not exist, or forgetting one that does.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import agents.memory
from openai import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AsyncOpenAI,
    NotFoundError,
    Omit,
    RateLimitError,
    omit,
)
from openai.types.conversations import ConversationItem

from agents_memory._closing import AsyncClosing
from agents_memory._codec import encode_items
from agents_memory._errors import SessionClosedError, SessionNotStartedError
from agents_memory._ids import validate_session_id
from agents_memory._protocol import SessionBase, coerce_settings, register_with_sdk, resolve_limit

if TYPE_CHECKING:
    from agents_memory._protocol import SessionSettings, TResponseInputItem

logger = logging.getLogger("agents_memory")

T = TypeVar("T")

OUTCOME_UNKNOWN = (
    "agents_memory: the server may or may not have applied this request (its answer was "
    "lost); it was not retried, so that it cannot be applied twice. Check with get_items() "
    "before writing again."
)
"""Added as a note to an error that leaves a write's outcome unknown."""

MAX_RETRY_DELAY = 8.0

MAX_ITEMS_PER_REQUEST = 20
"""The API's cap on items per create request (``POST /conversations`` and ``.../items``)."""

MAX_PAGE_SIZE = 100
"""The API's cap on ``limit`` when listing items."""


def rejected_as_input(item: Mapping[str, Any]) -> str | None:
    """Why the Conversations API would refuse ``item`` as input, or ``None`` if it takes it.

    A reasoning item is only accepted with its server ``id`` or its
    ``encrypted_content``; an empty one (``{"type": "reasoning", "summary": []}``,
    as reasoning models may emit) fails the whole request with ``invalid_item``
    (openai/openai-agents-python#3268, fixed the same way in #3352).
    """
    if item.get("type") == "reasoning" and not item.get("id") and not item.get("encrypted_content"):
        return "a reasoning item with neither an id nor encrypted_content"
    return None


def _default_client() -> tuple[AsyncOpenAI, bool]:
    """The Agents SDK's default client if one was set there, else a new one from the environment.

    The flag says whether the client is new (and so ours to close). The SDK is
    only consulted if it is already imported: if it is not, nobody set a client
    in it, and importing it here would cost more than the whole session.
    """
    sdk = sys.modules.get("agents.models._openai_shared")
    getter = getattr(sdk, "get_default_openai_client", None)
    shared = getter() if callable(getter) else None
    if shared is not None:
        return shared, False
    return AsyncOpenAI(), True


def _never_applied(exc: Exception) -> bool:
    """True when the server certainly did not apply the request, so sending it again is safe.

    A rate-limit refusal (429) is answered before any work; a connection that was
    never made (refused, DNS) carried no request. Anything else (a timeout, a
    5xx, a connection dropped mid-answer) may have been applied.
    """
    if isinstance(exc, RateLimitError):
        return True
    if not isinstance(exc, APIConnectionError) or isinstance(exc, APITimeoutError):
        return False
    # The HTTP stack wraps the socket's error; its chain ends at the standard library's.
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError | socket.gaierror):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def _delay(exc: Exception, attempt: int) -> float:
    """The server's ``retry-after(-ms)`` if it sent one, else exponential back-off."""
    response = exc.response if isinstance(exc, APIStatusError) else None
    if response is not None:
        for header, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
            try:
                return min(MAX_RETRY_DELAY, max(0.0, float(response.headers[header]) * scale))
            except (KeyError, ValueError):
                continue
    return float(min(MAX_RETRY_DELAY, 0.5 * 2**attempt))


def _adding(
    conversation_id: str, items: list[TResponseInputItem]
) -> Callable[[AsyncOpenAI], Awaitable[object]]:
    """The request that appends ``items`` (one batch), for :meth:`_applying`."""
    return lambda client: client.conversations.items.create(conversation_id, items=items)


def _deleting(conversation_id: str, item_id: str) -> Callable[[AsyncOpenAI], Awaitable[object]]:
    """The request that deletes one item, for :meth:`_applying`."""
    return lambda client: client.conversations.items.delete(
        item_id, conversation_id=conversation_id
    )


def _dump(item: ConversationItem) -> dict[str, Any]:
    """A listed item as the plain JSON dict the Session protocol deals in."""
    return item.model_dump(mode="json", exclude_unset=True)


class OpenAIConversationsSession(AsyncClosing, SessionBase):
    """One conversation's history, stored by OpenAI in a Conversation.

    Pass ``conversation_id`` to continue an existing conversation; without it, one
    is created by the first call that needs it (and reading :attr:`session_id`
    before that raises :class:`SessionNotStartedError`). Calls on one session
    are serialised, so a read never sees half of a write made through it.

    A write larger than 20 items takes several requests and is not atomic: if
    one fails, the earlier batches stay stored. Requests that change the
    conversation (item writes, deletes) are never retried by the client: the API
    takes no idempotency key, so a retry after a lost answer would store a batch
    twice (or pop two items). They are retried here only when the server
    certainly did not apply them (429, no connection made), up to the client's
    ``max_retries``; any other failure is raised with a note saying the outcome
    is unknown.
    """

    def __init__(
        self,
        *,
        conversation_id: str | None = None,
        openai_client: AsyncOpenAI | None = None,
        session_settings: SessionSettings | dict[str, Any] | None = None,
    ) -> None:
        self.session_settings: SessionSettings | None = coerce_settings(session_settings)
        self._conversation_id = (
            None if conversation_id is None else validate_session_id(conversation_id)
        )
        self._owns_client = False
        if openai_client is None:
            openai_client, self._owns_client = _default_client()
        self._client: AsyncOpenAI = openai_client
        self._lock = asyncio.Lock()
        self._closed = False

    @property
    def session_id(self) -> str:
        """The conversation id; raises :class:`SessionNotStartedError` before it exists."""
        if self._conversation_id is None:
            msg = (
                "this session has no conversation id yet: the conversation is created by the "
                "first get_items(), pop_item() or non-empty add_items(); call one of them first "
                "(or pass conversation_id= to continue an existing conversation)"
            )
            raise SessionNotStartedError(msg)
        return self._conversation_id

    @session_id.setter
    def session_id(self, value: str) -> None:
        self._conversation_id = validate_session_id(value)

    @property
    def conversation_id(self) -> str | None:
        """The conversation id, or ``None`` while the conversation has not been created."""
        return self._conversation_id

    @property
    def openai_client(self) -> AsyncOpenAI:
        """The client every request of this session goes through."""
        return self._client

    def __repr__(self) -> str:
        return f"{type(self).__name__}(conversation_id={self._conversation_id!r})"

    # -- plumbing -----------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            msg = "this session was closed; create a new OpenAIConversationsSession to use it"
            raise SessionClosedError(msg)

    async def _start(self, items: Sequence[TResponseInputItem]) -> str:
        """Create the conversation (with its first items); callers hold the lock.

        With items it is a write (see :meth:`_applying`); empty, a retry costs at
        most an empty conversation nobody points at, so the client's policy applies.
        """
        create = self._client.conversations.create
        if items:
            conversation = await self._applying(lambda c: c.conversations.create(items=list(items)))
        else:
            conversation = await create(items=[])
        self._conversation_id = conversation.id
        return conversation.id

    async def _applying(self, request: Callable[[AsyncOpenAI], Awaitable[T]]) -> T:
        """Send a request that changes the conversation, never twice unless never applied.

        The client's own retries are switched off for it (``with_options``, its
        public API); refusals the server certainly did not act on are retried
        here, as many times as the client would have.
        """
        client = self._client.with_options(max_retries=0)
        retries = getattr(self._client, "max_retries", 2)
        attempt = 0
        while True:
            try:
                return await request(client)
            except (APIConnectionError, APIStatusError) as exc:
                if _never_applied(exc) and attempt < retries:
                    await asyncio.sleep(_delay(exc, attempt))
                    attempt += 1
                    continue
                if isinstance(exc, APIConnectionError) or exc.status_code >= 500:  # noqa: PLR2004
                    exc.add_note(OUTCOME_UNKNOWN)
                raise

    def _sendable(self, items: Sequence[TResponseInputItem]) -> list[TResponseInputItem]:
        """``items`` without those the API rejects as input, each reported in one log line."""
        reasons = [rejected_as_input(cast("Mapping[str, Any]", item)) for item in items]
        if not any(reasons):
            return list(items)
        dropped = [f"item {i}: {reason}" for i, reason in enumerate(reasons) if reason]
        logger.warning(
            "not sending %d of %d items that the Conversations API rejects as input (%s)",
            len(dropped),
            len(items),
            "; ".join(dropped),
        )
        return [item for item, reason in zip(items, reasons, strict=True) if not reason]

    # -- the protocol -------------------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """Return the latest ``limit`` items (all when ``None``), oldest first.

        ``limit=None`` pages through the whole conversation oldest first; a limit
        reads newest first, at most 100 per page, and stops once it has enough.
        Without an explicit limit, ``session_settings.limit`` applies; ``0`` makes
        no request at all.
        """
        n = resolve_limit(limit, self.session_settings)
        self._check_open()
        if n == 0:
            return []
        async with self._lock:
            self._check_open()
            if self._conversation_id is None:
                await self._start(())
                return []  # just created, so empty: no need to ask
            items = await self._list(self._conversation_id, n)
        return cast("list[TResponseInputItem]", items)

    async def _list(self, conversation_id: str, limit: int | None) -> list[dict[str, Any]]:
        """Follow the API's cursor pages (``after`` / ``has_more``) until done or enough."""
        out: list[dict[str, Any]] = []
        after: str | Omit = omit
        while limit is None or len(out) < limit:
            page_size = MAX_PAGE_SIZE if limit is None else min(MAX_PAGE_SIZE, limit - len(out))
            page = await self._client.conversations.items.list(
                conversation_id,
                order="asc" if limit is None else "desc",
                limit=page_size,
                after=after,
            )
            out.extend(_dump(item) for item in page.data)
            if not page.data or not page.has_more:
                break
            after = page.last_id or str(out[-1]["id"])
        if limit is None:
            return out
        out = out[:limit]
        out.reverse()
        return out

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` in order, at most 20 per request; ``[]`` makes no request.

        Items are validated first (a non-dict or non-JSON item raises ``TypeError``
        before any request); items the API would reject are dropped with a warning.
        The first write to a new session creates the conversation with its first items.
        """
        encode_items(items)
        self._check_open()
        sendable = self._sendable(items)
        if not sendable:
            return
        batches = [
            sendable[i : i + MAX_ITEMS_PER_REQUEST]
            for i in range(0, len(sendable), MAX_ITEMS_PER_REQUEST)
        ]
        async with self._lock:
            self._check_open()
            if self._conversation_id is None:
                await self._start(batches.pop(0))
            conversation_id = self.session_id
            for batch in batches:
                await self._applying(_adding(conversation_id, batch))

    async def pop_item(self) -> TResponseInputItem | None:
        """Delete the newest item and return it; ``None`` when the conversation is empty.

        If another writer deletes that item first, the next newest is taken, so
        each item is returned by at most one ``pop_item()``.
        """
        self._check_open()
        async with self._lock:
            self._check_open()
            if self._conversation_id is None:
                await self._start(())
                return None
            conversation_id = self._conversation_id
            lost: str | None = None
            while True:
                page = await self._client.conversations.items.list(
                    conversation_id, order="desc", limit=1
                )
                if not page.data:
                    return None
                item = _dump(page.data[0])
                item_id = str(item["id"])
                try:
                    # A retried delete whose first answer was lost would see "not found"
                    # and pop the next item too: deletes are sent once (_applying).
                    await self._applying(_deleting(conversation_id, item_id))
                except NotFoundError:
                    if item_id == lost:  # listed again yet still "not found": do not spin
                        raise
                    lost = item_id
                    continue
                return cast("TResponseInputItem", item)

    async def clear_session(self) -> None:
        """Delete the conversation and forget its id; the next write starts a new one.

        A conversation that is already gone counts as cleared. Before the
        conversation exists this makes no request.
        """
        self._check_open()
        async with self._lock:
            self._check_open()
            if self._conversation_id is None:
                return
            try:
                await self._client.conversations.delete(self._conversation_id)
            except NotFoundError:
                logger.info("conversation %s was already deleted", self._conversation_id)
            self._conversation_id = None

    # -- lifetime -----------------------------------------------------------------------------

    async def close(self) -> None:
        """Close the client if this session created it; later calls raise.

        A client passed in (or the Agents SDK's default client) is left open for
        its owner. The conversation itself is kept: use :meth:`clear_session` to delete it.
        """
        self._closed = True
        if self._owns_client:
            await self._client.close()


# The Runner treats a Conversations-backed session specially wherever it checks
# ``isinstance(session, agents.OpenAIConversationsSession)``: model items are saved
# without their ids, history is matched ignoring ids, the reasoning-id policy and
# the clean-up of items the API refuses apply. Registering ours as a virtual
# subclass gives it that treatment at every such place, present and future.
agents.memory.OpenAIConversationsSession.register(OpenAIConversationsSession)
register_with_sdk()
