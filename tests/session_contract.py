"""The one conformance suite every database-backed Session implementation must pass.

Subclass :class:`SessionContract` in a test module (as ``Test...``) and give it a
``harness`` fixture: an object that makes sessions on the database under test,
and can look at (and tamper with) the stored rows behind the session's back.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any, Protocol

import agents
import pytest
from agents.extensions.memory import EncryptedSession
from agents.memory import OpenAIResponsesCompactionSession
from agents.testing import ScriptedModel, assistant_message

from agents_memory import Session, SessionSettings


def msg(i: int, role: str = "user") -> dict[str, Any]:
    return {"role": role, "content": f"message {i}", "type": "message"}


class Harness(Protocol):
    """What the contract needs from an implementation's test setup."""

    def session(
        self, session_id: str, *, session_settings: SessionSettings | dict[str, Any] | None = None
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

    # -- the Agents SDK's own types, wrappers and Runner over this session ---------------------

    async def test_settings_are_the_sdks_and_dicts_are_coerced(self, harness: Harness) -> None:
        """A dict becomes the SDK's SessionSettings (as the SDK's classes do) and applies."""
        assert SessionSettings is agents.SessionSettings
        s = harness.session("conv", session_settings={"limit": 2})
        assert type(s.session_settings) is agents.SessionSettings
        assert s.session_settings == agents.SessionSettings(limit=2)
        await s.add_items([msg(i) for i in range(4)])
        assert await s.get_items() == [msg(2), msg(3)]

    @pytest.mark.parametrize(
        ("settings", "match"),
        [
            ({"limitt": 1}, "Unknown session settings: limitt"),
            (SimpleNamespace(limit=1), "SessionSettings instance or a dict"),
        ],
    )
    async def test_bad_settings_are_a_type_error_up_front(
        self, harness: Harness, settings: Any, match: str
    ) -> None:
        """An unknown key or a foreign settings object is refused when the session is made."""
        with pytest.raises(TypeError, match=match):
            harness.session("conv", session_settings=settings)

    async def test_sdk_encrypted_session_wraps_it(self, harness: Harness) -> None:
        """agents.extensions.memory.EncryptedSession stores ciphertext here and reads it back."""
        key = "a-high-entropy-test-key-0123456789abcdef"
        inner = harness.session("enc")
        wrapped = EncryptedSession(session_id="enc", underlying_session=inner, encryption_key=key)
        await wrapped.add_items([msg(0), msg(1), msg(2)])
        assert await wrapped.get_items() == [msg(0), msg(1), msg(2)]
        assert await wrapped.get_items(limit=1) == [msg(2)]
        stored = await harness.session("enc").get_items()
        assert len(stored) == 3
        assert all(item.get("__enc__") == 1 and "payload" in item for item in stored)
        assert "message 0" not in str(stored)
        assert await wrapped.pop_item() == msg(2)
        again = EncryptedSession(
            session_id="enc", underlying_session=harness.session("enc"), encryption_key=key
        )
        assert await again.get_items() == [msg(0), msg(1)]
        await again.clear_session()
        assert not await harness.exists("enc")

    async def test_sdk_compaction_session_wraps_it(self, harness: Harness) -> None:
        """OpenAIResponsesCompactionSession replaces the stored history with the compacted one."""
        sent: list[dict[str, Any]] = []
        summary = {"type": "message", "role": "assistant", "content": "summary of 0-3"}

        async def compact(**kwargs: Any) -> Any:
            sent.append(kwargs)
            return SimpleNamespace(output=[summary], usage=None)

        client = SimpleNamespace(responses=SimpleNamespace(compact=compact))
        session = OpenAIResponsesCompactionSession(
            "cmp", harness.session("cmp"), client=client, compaction_mode="input"
        )
        await session.add_items([msg(i) for i in range(4)])
        await session.run_compaction({"force": True})
        assert [i["content"] for i in sent[0]["input"]] == [f"message {i}" for i in range(4)]
        assert await harness.session("cmp").get_items() == [summary]

    async def test_runner_honours_run_config_settings(self, harness: Harness) -> None:
        """RunConfig(session_settings=SessionSettings(limit=2)) limits the history sent."""
        s = harness.session("run")
        await s.add_items([msg(i) for i in range(4)])
        model = ScriptedModel([[assistant_message("ok")]])
        agent = agents.Agent(name="a", model=model)
        config = agents.RunConfig(
            session_settings=agents.SessionSettings(limit=2), tracing_disabled=True
        )
        result = await agents.Runner.run(agent, "new", session=s, run_config=config)
        assert result.final_output == "ok"
        sent = str(model.calls[0].input)
        assert "message 2" in sent
        assert "message 3" in sent
        assert "message 1" not in sent
        assert "new" in sent
        stored = await harness.session("run").get_items()
        assert len(stored) == 6
        assert stored[:4] == [msg(i) for i in range(4)]
