"""The one conformance suite every database-backed Session implementation must pass.

Subclass :class:`SessionContract` in a test module (as ``Test...``) and give it a
``harness`` fixture: an object that makes sessions on the database under test,
and can look at (and tamper with) the stored rows behind the session's back.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import pytest

from agents_memory import Session, SessionSettings


def msg(i: int, role: str = "user") -> dict[str, Any]:
    return {"role": role, "content": f"message {i}", "type": "message"}


class Harness(Protocol):
    """What the contract needs from an implementation's test setup."""

    def session(
        self, session_id: str, *, session_settings: SessionSettings | None = None
    ) -> Session:
        """A session on the database under test; sessions made with one id share their items."""
        ...

    async def exists(self, session_id: str) -> bool:
        """Whether the session's row is stored."""
        ...

    async def insert_raw(self, session_id: str, data: str) -> None:
        """Write a message row behind the library's back (as a broken writer would)."""
        ...


class SessionContract:
    """The Session protocol's behaviour, for any implementation (needs a ``harness`` fixture)."""

    async def test_is_a_session(self, harness: Harness) -> None:
        """It satisfies the runtime-checkable protocol the Agents SDK checks."""
        assert isinstance(harness.session("s"), Session)

    async def test_round_trip_in_order(self, harness: Harness) -> None:
        """Items come back exactly as stored, in insertion order, across batches."""
        s = harness.session("conv")
        items = [
            msg(0),
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}'},
            {"type": "function_call_output", "call_id": "c1", "output": "ünïcødé ✓ 😀 中文"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "x" * 5000}]},
            {"nested": {"list": [1, 2.5, True, None, {"k": "v"}]}, "empty": {}, "e": []},
        ]
        await s.add_items(items[:2])
        await s.add_items(items[2:])
        assert await s.get_items() == items

    async def test_limit_returns_latest_in_order(self, harness: Harness) -> None:
        """get_items(limit=N) is the latest N, oldest first; 0 is []; too large is all."""
        s = harness.session("conv")
        items = [msg(i) for i in range(10)]
        await s.add_items(items)
        assert await s.get_items(limit=3) == items[-3:]
        assert await s.get_items(limit=1) == items[-1:]
        assert await s.get_items(limit=0) == []
        assert await s.get_items(limit=100) == items

    async def test_settings_limit_and_override(self, harness: Harness) -> None:
        """Without a limit, session_settings.limit applies; an explicit limit overrides it."""
        s = harness.session("conv", session_settings=SessionSettings(limit=2))
        items = [msg(i) for i in range(5)]
        await s.add_items(items)
        assert await s.get_items() == items[-2:]
        assert await s.get_items(limit=4) == items[-4:]
        assert await s.get_items(limit=0) == []

    async def test_negative_limit_is_rejected(self, harness: Harness) -> None:
        """A negative or non-int limit is a clear error, not a silent full read."""
        s = harness.session("conv")
        with pytest.raises(ValueError, match="limit"):
            await s.get_items(limit=-1)
        with pytest.raises(TypeError, match="limit"):
            await s.get_items(limit="3")  # type: ignore[arg-type]

    async def test_empty_session(self, harness: Harness) -> None:
        """A session never written to reads empty and pops None."""
        s = harness.session("nobody")
        assert await s.get_items() == []
        assert await s.get_items(limit=5) == []
        assert await s.pop_item() is None

    async def test_pop_newest_until_empty(self, harness: Harness) -> None:
        """pop_item removes and returns the newest item each time, then None."""
        s = harness.session("conv")
        items = [msg(i) for i in range(3)]
        await s.add_items(items)
        assert await s.pop_item() == items[2]
        assert await s.get_items() == items[:2]
        assert await s.pop_item() == items[1]
        assert await s.pop_item() == items[0]
        assert await s.pop_item() is None
        await s.add_items([msg(9)])
        assert await s.get_items() == [msg(9)]

    async def test_clear_removes_session_and_items(self, harness: Harness) -> None:
        """clear_session deletes the session row and all its items, leaving others alone."""
        a, b = harness.session("a"), harness.session("b")
        await a.add_items([msg(1), msg(2)])
        await b.add_items([msg(3)])
        await a.clear_session()
        assert await a.get_items() == []
        assert not await harness.exists("a")
        assert await b.get_items() == [msg(3)]
        await a.clear_session()  # clearing an absent session is fine
        await a.add_items([msg(4)])
        assert await a.get_items() == [msg(4)]

    async def test_add_nothing_does_nothing(self, harness: Harness) -> None:
        """add_items([]) writes no session row."""
        s = harness.session("conv")
        await s.add_items([])
        assert not await harness.exists("conv")

    async def test_sessions_are_isolated(self, harness: Harness) -> None:
        """Items of one session never appear in another."""
        a, b = harness.session("a"), harness.session("b")
        await a.add_items([msg(1)])
        await b.add_items([msg(2)])
        await a.add_items([msg(3)])
        assert await a.get_items() == [msg(1), msg(3)]
        assert await b.get_items() == [msg(2)]
        assert await b.pop_item() == msg(2)
        assert await a.get_items() == [msg(1), msg(3)]

    @pytest.mark.parametrize(
        "bad",
        [
            [msg(1), object()],
            [msg(1), None],
            [msg(1), {"x": object()}],
            [msg(1), "not a dict"],
            [msg(1), {1: "int key"}],
            [msg(1), {"v": float("nan")}],
            [msg(1), {"v": float("inf")}],
        ],
    )
    async def test_bad_item_rejects_whole_batch(self, harness: Harness, bad: list[Any]) -> None:
        """A bad item raises a typed error before anything of its batch is written."""
        s = harness.session("conv")
        await s.add_items([msg(0)])
        with pytest.raises((TypeError, ValueError)):
            await s.add_items(bad)
        assert await s.get_items() == [msg(0)]

    async def test_items_must_be_a_list(self, harness: Harness) -> None:
        """A dict or string passed as the batch is a TypeError, not a list of its keys."""
        s = harness.session("conv")
        with pytest.raises(TypeError):
            await s.add_items(msg(1))  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            await s.add_items("abc")  # type: ignore[arg-type]
        assert await s.get_items() == []

    async def test_awkward_text_round_trips(self, harness: Harness) -> None:
        """NUL characters, lone surrogates, quotes and SQL in text round-trip exactly."""
        s = harness.session("conv")
        items = [
            {"content": "nul \x00 inside"},
            {"content": "lone \ud800 surrogate"},
            {"content": "'; DROP TABLE x; --\" \\ \n\t"},
        ]
        await s.add_items(items)
        assert await s.get_items() == items

    @pytest.mark.parametrize(
        ("session_id", "error"),
        [("", ValueError), (None, TypeError), (42, TypeError), ("x" * 256, ValueError)],
    )
    async def test_bad_session_id(self, harness: Harness, session_id: Any, error: type) -> None:
        """An empty, overlong or non-string session id is refused up front."""
        with pytest.raises(error):
            harness.session(session_id)

    async def test_hostile_session_ids_round_trip(self, harness: Harness) -> None:
        """Ids with quotes, SQL and unicode are plain data: stored and found exactly."""
        ids = ["'; DROP TABLE agent_sessions; --", 'a"b', "ユーザー-1 😀", "x" * 255]
        for i, sid in enumerate(ids):
            await harness.session(sid).add_items([msg(i)])
        for i, sid in enumerate(ids):
            assert await harness.session(sid).get_items() == [msg(i)]

    async def test_corrupt_rows_are_skipped(
        self, harness: Harness, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Invalid JSON rows are skipped with a warning, and limit still counts valid items."""
        s = harness.session("conv")
        await s.add_items([msg(0), msg(1)])
        await harness.insert_raw("conv", "{not json")
        await s.add_items([msg(2)])
        await harness.insert_raw("conv", '"a string, not an object"')
        with caplog.at_level(logging.WARNING, logger="agents_memory"):
            assert await s.get_items() == [msg(0), msg(1), msg(2)]
            assert await s.get_items(limit=2) == [msg(1), msg(2)]
            assert await s.get_items(limit=3) == [msg(0), msg(1), msg(2)]
        assert "not valid JSON" in caplog.text
        assert await s.pop_item() == msg(2)
        assert await s.get_items() == [msg(0), msg(1)]
