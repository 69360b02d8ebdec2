"""OpenAIConversationsSession against a real HTTP server, through the real AsyncOpenAI client."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import agents
import openai
import pytest
from agents import testing
from fake_conversations_server import FakeConversationsServer
from openai import AsyncOpenAI

from agents_memory import (
    OpenAIConversationsSession,
    Session,
    SessionABC,
    SessionClosedError,
    SessionNotStartedError,
    SessionSettings,
)
from agents_memory._openai_conversations import OUTCOME_UNKNOWN, _never_applied

ITEMS = r"/conversations/[^/]+/items"
ONE_ITEM = r"/conversations/[^/]+/items/[^/]+"
ONE_CONVERSATION = r"/conversations/[^/]+"


def msg(i: int, role: str = "user") -> dict[str, Any]:
    kind = "input_text" if role == "user" else "output_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": f"message {i}"}]}


def without_ids(items: list[Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in item.items() if k != "id"} for item in items]


@pytest.fixture
def server() -> Iterator[FakeConversationsServer]:
    s = FakeConversationsServer()
    s.start()
    yield s
    s.stop()


@pytest.fixture
async def client(server: FakeConversationsServer) -> AsyncIterator[AsyncOpenAI]:
    """The real client, pointed at the fake server, with retries off so errors surface at once."""
    c = AsyncOpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
    yield c
    await c.close()


@pytest.fixture
def session(client: AsyncOpenAI) -> OpenAIConversationsSession:
    return OpenAIConversationsSession(openai_client=client)


# -- creation -------------------------------------------------------------------------------


async def test_is_a_session(session: OpenAIConversationsSession) -> None:
    """It is a SessionABC, and satisfies the runtime-checkable protocol once it has an id."""
    assert isinstance(session, SessionABC)
    isinstance(session, Session)  # before the id exists, checking must not raise
    await session.add_items([msg(0)])
    assert isinstance(session, Session)


async def test_session_id_before_creation_is_a_clear_error(
    session: OpenAIConversationsSession, server: FakeConversationsServer
) -> None:
    """Reading session_id before the first call raises a typed error that says what to do."""
    with pytest.raises(SessionNotStartedError, match="get_items"):
        _ = session.session_id
    with pytest.raises(ValueError, match="no conversation id yet"):  # as in the Agents SDK
        _ = session.session_id
    assert getattr(session, "session_id", None) is None
    assert session.conversation_id is None
    assert server.requests == []


async def test_first_call_creates_the_conversation(
    session: OpenAIConversationsSession, server: FakeConversationsServer
) -> None:
    """get_items() on a new session creates the conversation and reads nothing more."""
    assert await session.get_items() == []
    assert len(server.requests) == 1
    assert server.requests[0].method == "POST"
    assert server.requests[0].path == "/conversations"
    assert session.session_id in server.conversations
    assert session.conversation_id == session.session_id


async def test_first_write_creates_with_its_items(
    session: OpenAIConversationsSession, server: FakeConversationsServer
) -> None:
    """The first add_items() creates the conversation carrying its items: one request."""
    await session.add_items([msg(0), msg(1)])
    assert [(r.method, r.path) for r in server.requests] == [("POST", "/conversations")]
    assert without_ids(server.items(session.session_id)) == [msg(0), msg(1)]


async def test_concurrent_first_calls_create_once(
    session: OpenAIConversationsSession, server: FakeConversationsServer
) -> None:
    """Racing first calls create exactly one conversation, and every write lands in it."""
    server.create_delay = 0.05  # keep the first create in flight while the others arrive
    results = await asyncio.gather(
        session.get_items(),
        session.add_items([msg(1)]),
        session.pop_item(),
        session.add_items([msg(2)]),
        session.get_items(limit=3),
    )
    assert len(server.requests_matching("POST", "/conversations")) == 1
    assert list(server.conversations) == [session.session_id]
    popped = [results[2]] if results[2] is not None else []
    stored = without_ids(server.items(session.session_id) + popped)
    assert sorted(i["content"][0]["text"] for i in stored) == ["message 1", "message 2"]


async def test_existing_conversation_is_continued(
    client: AsyncOpenAI, server: FakeConversationsServer
) -> None:
    """With conversation_id, the session reads that conversation and creates nothing."""
    conversation_id = server.add_conversation([msg(0), msg(1)])
    session = OpenAIConversationsSession(conversation_id=conversation_id, openai_client=client)
    assert session.session_id == conversation_id
    assert without_ids(await session.get_items()) == [msg(0), msg(1)]
    other = OpenAIConversationsSession(openai_client=client)
    other.session_id = conversation_id  # the Agents SDK's setter, kept
    assert await other.get_items(limit=1) == (await session.get_items())[-1:]
    assert server.requests_matching("POST") == []


# -- no request where none is needed ---------------------------------------------------------


async def test_nothing_to_do_makes_no_request(
    session: OpenAIConversationsSession, server: FakeConversationsServer
) -> None:
    """add_items([]), get_items(limit=0) and clearing a never-created session send nothing."""
    await session.add_items([])
    assert await session.get_items(limit=0) == []
    await session.clear_session()
    assert server.requests == []
    await session.add_items([msg(0)])
    before = len(server.requests)
    await session.add_items([])
    assert await session.get_items(limit=0) == []
    assert len(server.requests) == before


async def test_bad_items_are_refused_before_any_request(
    session: OpenAIConversationsSession, server: FakeConversationsServer
) -> None:
    """A non-dict or non-JSON item raises TypeError/ValueError and nothing is sent."""
    for bad in ([msg(0), object()], [msg(0), "text"], [msg(0), {"v": float("nan")}]):
        with pytest.raises((TypeError, ValueError)):
            await session.add_items(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await session.add_items(msg(0))  # type: ignore[arg-type]
    assert server.requests == []


# -- reading ----------------------------------------------------------------------------------


async def test_get_items_follows_every_page_oldest_first(
    client: AsyncOpenAI, server: FakeConversationsServer
) -> None:
    """get_items() pages through 250 items 100 at a time (after=last_id) and returns all."""
    items = [msg(i) for i in range(250)]
    conversation_id = server.add_conversation(items)
    session = OpenAIConversationsSession(conversation_id=conversation_id, openai_client=client)
    got = await session.get_items()
    assert without_ids(got) == items
    assert [i["id"] for i in got] == [i["id"] for i in server.items(conversation_id)]
    pages = server.requests_matching("GET", ITEMS)
    assert [r.query.get("limit") for r in pages] == ["100", "100", "100"]
    assert {r.query.get("order") for r in pages} == {"asc"}
    assert [r.query.get("after") for r in pages] == [None, got[99]["id"], got[199]["id"]]


async def test_limit_reads_newest_pages_and_stops(
    client: AsyncOpenAI, server: FakeConversationsServer
) -> None:
    """get_items(limit=N) reads newest first in pages of at most 100 and stops at N."""
    items = [msg(i) for i in range(250)]
    conversation_id = server.add_conversation(items)
    session = OpenAIConversationsSession(conversation_id=conversation_id, openai_client=client)

    assert without_ids(await session.get_items(limit=150)) == items[-150:]
    pages = server.requests_matching("GET", ITEMS)
    assert [(r.query.get("order"), r.query.get("limit")) for r in pages] == [
        ("desc", "100"),
        ("desc", "50"),
    ]
    assert pages[1].query.get("after") == server.items(conversation_id)[150]["id"]

    server.requests.clear()
    assert without_ids(await session.get_items(limit=3)) == items[-3:]
    assert [r.query.get("limit") for r in server.requests] == ["3"]

    server.requests.clear()
    assert without_ids(await session.get_items(limit=1000)) == items
    assert [r.query.get("limit") for r in server.requests] == ["100", "100", "100"]


async def test_settings_limit_and_override(
    client: AsyncOpenAI, server: FakeConversationsServer
) -> None:
    """Without a limit, session_settings.limit applies; an explicit limit overrides it."""
    items = [msg(i) for i in range(5)]
    session = OpenAIConversationsSession(
        conversation_id=server.add_conversation(items),
        openai_client=client,
        session_settings=SessionSettings(limit=2),
    )
    assert without_ids(await session.get_items()) == items[-2:]
    assert without_ids(await session.get_items(limit=4)) == items[-4:]
    with pytest.raises(ValueError, match="limit"):
        await session.get_items(limit=-1)


# -- writing ----------------------------------------------------------------------------------


async def test_writes_go_in_batches_of_twenty_in_order(
    session: OpenAIConversationsSession, server: FakeConversationsServer
) -> None:
    """45 items take three requests (20, 20, 5) and are stored in order."""
    await session.add_items([msg(0)])
    items = [msg(i) for i in range(1, 46)]
    await session.add_items(items)
    batches = server.requests_matching("POST", ITEMS)
    assert [len(r.body["items"]) for r in batches] == [20, 20, 5]
    assert without_ids(server.items(session.session_id)) == [msg(0), *items]


async def test_first_write_of_many_items_creates_then_appends(
    session: OpenAIConversationsSession, server: FakeConversationsServer
) -> None:
    """A first write of 25 items creates the conversation with 20 and appends the other 5."""
    items = [msg(i) for i in range(25)]
    await session.add_items(items)
    assert [(r.method, r.path, len(r.body["items"])) for r in server.requests] == [
        ("POST", "/conversations", 20),
        ("POST", f"/conversations/{session.session_id}/items", 5),
    ]
    assert without_ids(await session.get_items()) == items


async def test_items_the_api_rejects_are_dropped_with_a_log_line(
    session: OpenAIConversationsSession,
    server: FakeConversationsServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Empty reasoning items are not sent (the API fails the request on them); a log says so."""
    empty_reasoning = {"type": "reasoning", "summary": []}
    with_id = {"type": "reasoning", "id": "rs_1", "summary": []}
    encrypted = {"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}
    with caplog.at_level(logging.WARNING, logger="agents_memory"):
        await session.add_items([msg(0), empty_reasoning, with_id, encrypted, msg(1)])
    assert "not sending 1 of 5 items" in caplog.text
    assert "item 1: a reasoning item with neither an id nor encrypted_content" in caplog.text
    stored = server.items(session.session_id)
    assert without_ids(stored) == [msg(0), {"type": "reasoning", "summary": []}, encrypted, msg(1)]
    assert stored[1]["id"] == "rs_1"

    before = len(server.requests)
    await session.add_items([empty_reasoning])
    assert len(server.requests) == before


async def test_the_server_really_rejects_empty_reasoning(
    client: AsyncOpenAI, server: FakeConversationsServer
) -> None:
    """The fake API refuses an empty reasoning item as the real one does (so dropping matters)."""
    conversation_id = server.add_conversation([])
    with pytest.raises(openai.BadRequestError) as info:
        await client.conversations.items.create(
            conversation_id,
            items=[{"type": "reasoning", "summary": []}],  # type: ignore[typeddict-item]
        )
    assert info.value.code == "invalid_item"


# -- pop and clear ----------------------------------------------------------------------------


async def test_pop_deletes_and_returns_newest(
    session: OpenAIConversationsSession, server: FakeConversationsServer
) -> None:
    """pop_item removes and returns the newest item each time, then None."""
    items = [msg(i) for i in range(3)]
    await session.add_items(items)
    stored = server.items(session.session_id)
    assert await session.pop_item() == stored[2]
    assert without_ids(server.items(session.session_id)) == items[:2]
    assert await session.pop_item() == stored[1]
    assert await session.pop_item() == stored[0]
    assert await session.pop_item() is None
    assert server.items(session.session_id) == []


async def test_pop_on_new_session_creates_and_returns_none(
    session: OpenAIConversationsSession, server: FakeConversationsServer
) -> None:
    """pop_item() on a new session creates the (empty) conversation and returns None."""
    assert await session.pop_item() is None
    assert len(server.requests) == 1
    assert server.items(session.session_id) == []


async def test_concurrent_pops_from_two_sessions_claim_each_item_once(
    client: AsyncOpenAI, server: FakeConversationsServer
) -> None:
    """Two sessions on one conversation popping concurrently return every item exactly once."""
    conversation_id = server.add_conversation([{**msg(i), "n": i} for i in range(30)])
    a = OpenAIConversationsSession(conversation_id=conversation_id, openai_client=client)
    b = OpenAIConversationsSession(conversation_id=conversation_id, openai_client=client)
    popped: list[int] = []

    async def drain(s: OpenAIConversationsSession) -> None:
        while (item := await s.pop_item()) is not None:
            popped.append(item["n"])  # type: ignore[typeddict-item]

    await asyncio.gather(drain(a), drain(b), drain(a), drain(b))
    assert sorted(popped) == list(range(30))
    assert server.items(conversation_id) == []


async def test_pop_retries_once_when_the_item_vanished(
    session: OpenAIConversationsSession, server: FakeConversationsServer
) -> None:
    """A 404 on the delete (another writer won) re-reads; a second 404 for it is raised."""
    await session.add_items([msg(0), msg(1)])
    server.fail("DELETE", ONE_ITEM, 404, message="Item not found.")
    assert without_ids([await session.pop_item()]) == [msg(1)]  # type: ignore[list-item]
    server.fail("DELETE", ONE_ITEM, 404, times=2, message="Item not found.")
    with pytest.raises(openai.NotFoundError):
        await session.pop_item()
    assert without_ids(server.items(session.session_id)) == [msg(0)]


async def test_clear_deletes_the_conversation_and_forgets_it(
    session: OpenAIConversationsSession, server: FakeConversationsServer
) -> None:
    """clear_session deletes the conversation; the next write starts a new one."""
    await session.add_items([msg(0)])
    first = session.session_id
    await session.clear_session()
    assert first not in server.conversations
    assert session.conversation_id is None
    with pytest.raises(SessionNotStartedError):
        _ = session.session_id
    await session.add_items([msg(1)])
    assert session.session_id != first
    assert without_ids(await session.get_items()) == [msg(1)]


async def test_clearing_a_conversation_already_gone_is_fine(
    client: AsyncOpenAI, server: FakeConversationsServer
) -> None:
    """Clearing a conversation someone else deleted forgets the id without an error."""
    session = OpenAIConversationsSession(conversation_id="conv_gone", openai_client=client)
    await session.clear_session()
    assert session.conversation_id is None


# -- errors reach the caller, nothing half-done ----------------------------------------------


async def test_unknown_conversation_is_not_found(
    client: AsyncOpenAI, server: FakeConversationsServer
) -> None:
    """A 404 reaches the caller as openai.NotFoundError, and the session keeps its id."""
    session = OpenAIConversationsSession(conversation_id="conv_missing", openai_client=client)
    with pytest.raises(openai.NotFoundError, match="conv_missing"):
        await session.get_items()
    with pytest.raises(openai.NotFoundError):
        await session.add_items([msg(0)])
    with pytest.raises(openai.NotFoundError):
        await session.pop_item()
    assert session.session_id == "conv_missing"
    assert server.conversations == {}


async def test_rate_limited_create_leaves_no_conversation(
    session: OpenAIConversationsSession, server: FakeConversationsServer
) -> None:
    """A 429 on create raises RateLimitError; the session stays unstarted and recovers."""
    server.fail("POST", "/conversations", 429, message="Rate limit reached")
    with pytest.raises(openai.RateLimitError, match="Rate limit reached"):
        await session.add_items([msg(0)])
    assert session.conversation_id is None
    assert server.conversations == {}
    await session.add_items([msg(0)])
    assert without_ids(server.items(session.session_id)) == [msg(0)]


async def test_server_error_on_write_stores_nothing(
    session: OpenAIConversationsSession, server: FakeConversationsServer
) -> None:
    """A 500 on add_items raises InternalServerError, stores nothing, and a retry works."""
    await session.add_items([msg(0)])
    server.fail("POST", ITEMS, 500)
    with pytest.raises(openai.InternalServerError):
        await session.add_items([msg(1)])
    assert without_ids(server.items(session.session_id)) == [msg(0)]
    await session.add_items([msg(1)])
    assert without_ids(await session.get_items()) == [msg(0), msg(1)]


async def test_server_error_on_pop_keeps_the_item(
    session: OpenAIConversationsSession, server: FakeConversationsServer
) -> None:
    """A 500 on the delete raises and returns nothing; the item is still there to pop."""
    await session.add_items([msg(0), msg(1)])
    server.fail("DELETE", ONE_ITEM, 500)
    with pytest.raises(openai.InternalServerError):
        await session.pop_item()
    assert len(server.items(session.session_id)) == 2
    assert without_ids([await session.pop_item()]) == [msg(1)]  # type: ignore[list-item]


async def test_server_error_on_clear_keeps_the_id(
    session: OpenAIConversationsSession, server: FakeConversationsServer
) -> None:
    """A 500 on the conversation delete raises; the session keeps its id and can retry."""
    await session.add_items([msg(0)])
    conversation_id = session.session_id
    server.fail("DELETE", ONE_CONVERSATION, 500)
    with pytest.raises(openai.InternalServerError):
        await session.clear_session()
    assert session.session_id == conversation_id
    assert conversation_id in server.conversations
    await session.clear_session()
    assert conversation_id not in server.conversations


async def test_multi_request_write_is_never_retried(
    server: FakeConversationsServer, client: AsyncOpenAI
) -> None:
    """A 25-item write whose second batch fails keeps the first and does not retry the second.

    The client here would retry a 500 twice; a write spanning requests switches
    retries off so that a lost response can never store a batch twice.
    """
    retrying = client.with_options(max_retries=2)
    session = OpenAIConversationsSession(openai_client=retrying)
    await session.add_items([msg(0)])
    server.fail("POST", ITEMS, 500, headers={"retry-after-ms": "1"})
    with pytest.raises(openai.InternalServerError):
        await session.add_items([msg(i) for i in range(1, 26)])
    assert len(server.requests_matching("POST", ITEMS)) == 1
    assert without_ids(server.items(session.session_id)) == [msg(0)]


def _unknown_outcome(exc: BaseException) -> bool:
    return OUTCOME_UNKNOWN in getattr(exc, "__notes__", [])


async def test_a_lost_answer_to_a_write_never_stores_it_twice(
    server: FakeConversationsServer, client: AsyncOpenAI
) -> None:
    """The server stores the batch, the gateway answers 502: not retried, stored once, said so.

    The client would retry a 502 twice; with no idempotency key in the API that
    stored the SDK's batch twice.
    """
    session = OpenAIConversationsSession(openai_client=client.with_options(max_retries=2))
    await session.add_items([msg(0)])
    server.fail("POST", ITEMS, 502, applied=True, headers={"retry-after-ms": "1"})
    with pytest.raises(openai.InternalServerError) as info:
        await session.add_items([msg(1)])
    assert _unknown_outcome(info.value)
    assert len(server.requests_matching("POST", ITEMS)) == 1  # (the first write created it)
    assert without_ids(server.items(session.session_id)) == [msg(0), msg(1)]


async def test_a_lost_answer_to_the_creating_write_creates_one_conversation(
    server: FakeConversationsServer, client: AsyncOpenAI
) -> None:
    """The first write creates the conversation with its items: also sent once."""
    session = OpenAIConversationsSession(openai_client=client.with_options(max_retries=2))
    server.fail("POST", "/conversations", 502, applied=True, headers={"retry-after-ms": "1"})
    with pytest.raises(openai.InternalServerError) as info:
        await session.add_items([msg(0)])
    assert _unknown_outcome(info.value)
    assert len(server.conversations) == 1
    assert session.conversation_id is None  # its id never reached us: nothing points at it


async def test_a_lost_answer_to_a_pop_deletes_one_item(
    server: FakeConversationsServer, client: AsyncOpenAI
) -> None:
    """A retried delete would find the item gone and pop the next one too: sent once."""
    session = OpenAIConversationsSession(openai_client=client.with_options(max_retries=2))
    await session.add_items([msg(0), msg(1), msg(2)])
    server.fail("DELETE", ONE_ITEM, 502, applied=True, headers={"retry-after-ms": "1"})
    with pytest.raises(openai.InternalServerError) as info:
        await session.pop_item()
    assert _unknown_outcome(info.value)
    assert without_ids(server.items(session.session_id)) == [msg(0), msg(1)]


async def test_a_server_error_on_a_write_is_not_retried(
    server: FakeConversationsServer, client: AsyncOpenAI
) -> None:
    """A 500 may have been applied: raised at once with the note; the caller decides."""
    session = OpenAIConversationsSession(openai_client=client.with_options(max_retries=2))
    await session.add_items([msg(0)])
    server.fail("POST", ITEMS, 500, headers={"retry-after-ms": "1"})
    with pytest.raises(openai.InternalServerError) as info:
        await session.add_items([msg(1)])
    assert _unknown_outcome(info.value)
    assert len(server.requests_matching("POST", ITEMS)) == 1
    assert without_ids(server.items(session.session_id)) == [msg(0)]


async def test_a_rate_limited_write_is_retried(
    server: FakeConversationsServer, client: AsyncOpenAI
) -> None:
    """429 is a refusal before any work: retried (after retry-after), stored once."""
    session = OpenAIConversationsSession(openai_client=client.with_options(max_retries=2))
    await session.add_items([msg(0)])
    server.fail("POST", ITEMS, 429, times=2, headers={"retry-after-ms": "1"})
    await session.add_items([msg(1)])
    assert len(server.requests_matching("POST", ITEMS)) == 3  # two refused, one stored
    assert without_ids(server.items(session.session_id)) == [msg(0), msg(1)]


async def test_rate_limits_past_the_clients_retries_are_raised(
    server: FakeConversationsServer, client: AsyncOpenAI
) -> None:
    """As many retries as the client's max_retries, then the 429 (nothing was stored)."""
    session = OpenAIConversationsSession(openai_client=client.with_options(max_retries=1))
    await session.add_items([msg(0)])
    server.fail("POST", ITEMS, 429, times=5, headers={"retry-after-ms": "1"})
    with pytest.raises(openai.RateLimitError) as info:
        await session.add_items([msg(1)])
    assert not _unknown_outcome(info.value)
    assert len(server.requests_matching("POST", ITEMS)) == 2
    assert without_ids(server.items(session.session_id)) == [msg(0)]


async def test_a_connection_never_made_counts_as_never_applied() -> None:
    """A refused connection (nothing listens on port 1) is the one connection error retried."""
    dead = AsyncOpenAI(base_url="http://127.0.0.1:1/v1", api_key="sk-test", max_retries=0)
    with pytest.raises(openai.APIConnectionError) as info:
        await dead.conversations.create(items=[])
    assert _never_applied(info.value)
    await dead.close()


# -- construction and lifetime ----------------------------------------------------------------


async def test_default_client_comes_from_the_environment(
    server: FakeConversationsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without openai_client, a client is made from OPENAI_API_KEY/OPENAI_BASE_URL and owned."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    async with OpenAIConversationsSession() as session:
        await session.add_items([msg(0)])
        assert without_ids(await session.get_items()) == [msg(0)]
        assert session.openai_client.base_url.host == "127.0.0.1"
    assert session.openai_client.is_closed()
    with pytest.raises(SessionClosedError):
        await session.get_items()


async def test_close_leaves_a_passed_client_open(
    session: OpenAIConversationsSession, client: AsyncOpenAI
) -> None:
    """Closing a session does not close a client it was given; later calls raise."""
    await session.add_items([msg(0)])
    await session.close()
    assert not client.is_closed()
    for call in (session.get_items(), session.add_items([msg(1)]), session.pop_item()):
        with pytest.raises(SessionClosedError):
            await call
    with pytest.raises(SessionClosedError):
        await session.clear_session()


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"conversation_id": ""}, ValueError),
        ({"conversation_id": 3}, TypeError),
        ({"session_settings": {"limitt": 1}}, TypeError),
    ],
)
def test_bad_arguments(kwargs: dict[str, Any], error: type[Exception]) -> None:
    """An empty or non-string conversation id, or an unknown setting, is refused up front."""
    with pytest.raises(error):
        OpenAIConversationsSession(**kwargs)


@pytest.mark.integration
async def test_runner_keeps_history_in_the_conversation(
    session: OpenAIConversationsSession, server: FakeConversationsServer
) -> None:
    """The Agents SDK's Runner, with a scripted model, keeps two turns in the conversation."""
    model = testing.ScriptedModel(
        [
            [testing.assistant_message("Paris.", item_id="msg_a1")],
            [testing.assistant_message("About 2.1 million.", item_id="msg_a2")],
        ]
    )
    agent = agents.Agent(name="geo", instructions="Answer briefly.", model=model)
    first = await agents.Runner.run(agent, "Capital of France?", session=session)
    second = await agents.Runner.run(agent, "How many people?", session=session)
    assert (first.final_output, second.final_output) == ("Paris.", "About 2.1 million.")
    assert "Capital of France?" in str(model.calls[1].input)
    assert "Paris." in str(model.calls[1].input)
    stored = server.items(session.session_id)
    assert [i["role"] for i in stored] == ["user", "assistant", "user", "assistant"]
    assert len(server.requests_matching("POST", "/conversations")) == 1


class ClientProxy:
    """A wrapper of the client (as observability tools make): not an ``AsyncOpenAI``."""

    def __init__(self, inner: AsyncOpenAI) -> None:
        self._inner = inner
        self.attributes_read: list[str] = []

    def __getattr__(self, name: str) -> Any:
        self.attributes_read.append(name)
        return getattr(self._inner, name)


async def test_any_client_with_the_methods_is_accepted(
    client: AsyncOpenAI, server: FakeConversationsServer
) -> None:
    """A proxy of the client is used as the SDK would use it, for every operation."""
    proxy = ClientProxy(client)
    session = OpenAIConversationsSession(openai_client=proxy, session_settings={"limit": 1})  # type: ignore[arg-type]
    assert session.openai_client is proxy
    assert type(session.session_settings) is agents.SessionSettings
    await session.add_items([msg(1), msg(2)])
    assert without_ids(await session.get_items()) == [msg(2)]
    assert without_ids(server.items(session.session_id)) == [msg(1), msg(2)]
    assert without_ids([await session.pop_item()]) == [msg(2)]
    await session.clear_session()
    assert "conversations" in proxy.attributes_read


def _bodies(server: FakeConversationsServer) -> list[tuple[str, Any]]:
    """What each write request sent, with the conversation ids taken out."""
    return [
        (r.path.split("/")[-1] if r.path.endswith("items") else r.path, r.body)
        for r in server.requests
        if r.method == "POST"
    ]


@pytest.mark.integration
async def test_runner_treats_it_as_its_own_conversations_session(client: AsyncOpenAI) -> None:
    """The Runner sends exactly what it sends for the SDK's class: model items without ids.

    The Runner recognises a Conversations-backed session with ``isinstance``; ours is
    registered as a virtual subclass of the SDK's class, so every such check applies.
    """
    assert isinstance(
        OpenAIConversationsSession(openai_client=client), agents.OpenAIConversationsSession
    )
    sent: dict[str, list[tuple[str, Any]]] = {}
    for name, cls in (
        ("sdk", agents.OpenAIConversationsSession),
        ("ours", OpenAIConversationsSession),
    ):
        server = FakeConversationsServer()
        server.start()
        try:
            async with AsyncOpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0) as c:
                session = cls(openai_client=c)
                model = testing.ScriptedModel(
                    [
                        [testing.assistant_message("Paris.", item_id="msg_model_1")],
                        [testing.assistant_message("Lots.", item_id="msg_model_2")],
                    ]
                )
                agent = agents.Agent(name="geo", model=model)
                config = agents.RunConfig(tracing_disabled=True)
                await agents.Runner.run(agent, "Capital?", session=session, run_config=config)
                await agents.Runner.run(agent, "People?", session=session, run_config=config)
                assert "Paris." in str(model.calls[1].input)
                sent[name] = _bodies(server)
                stored = server.items(session.session_id)
        finally:
            server.stop()
        assert "msg_model_1" not in str(sent[name])
        assert [i["id"] for i in stored if i.get("id", "").startswith("msg_model")] == []
    assert sent["ours"] == sent["sdk"]
