"""Model-based: random add/get/pop/clear/iter sequences over several sessions agree with a list.

Hypothesis drives a state machine whose every step runs against the real store
and against a plain in-memory model; any disagreement fails with a shrunk,
replayable sequence of steps. Async steps run on one ``asyncio.Runner`` that the
test owns, since Hypothesis calls the rules synchronously.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from typing import Any, ClassVar

import pytest
from _support import Ledger, fresh_names, open_store, scaled
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test
from sqlalchemy import MetaData, Table
from sqlalchemy.schema import DropTable

from agents_memory import SessionStore

pytestmark = pytest.mark.reliability

SESSION_IDS = ["plain", "quote'\"; DROP TABLE x; --", "ユーザー 😀"]

AWKWARD = [
    "",
    "\x00",
    "nul\x00in",
    "\ud800",
    "a\udfffb",
    "'; DROP TABLE t; --",
    '"',
    "\\",
    "\u2028",
]
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(AWKWARD)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
keys = st.text(max_size=8) | st.sampled_from(["type", "role", "content", *AWKWARD])
items = st.dictionaries(keys, values, max_size=4)


def canon(value: Any) -> Any:
    """A form that tells apart what ``==`` conflates: 1/1.0/True, 0.0/-0.0, key order."""
    if isinstance(value, dict):
        return ("d", tuple((k, canon(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("l", tuple(canon(v) for v in value))
    if isinstance(value, float):
        return ("f", value.hex())
    return (type(value).__name__, value)


class StoreMachine(RuleBasedStateMachine):
    """Several sessions of one store against a dict of lists."""

    runner: ClassVar[asyncio.Runner]
    store: ClassVar[SessionStore]
    steps: ClassVar[int] = 0
    disagreements: ClassVar[int] = 0

    def __init__(self) -> None:
        super().__init__()
        prefix = uuid.uuid4().hex[:8]
        self.ids = [f"{prefix}-{sid}" for sid in SESSION_IDS]
        self.model: dict[str, list[dict[str, Any]]] = {sid: [] for sid in self.ids}

    def run(self, coro: Any) -> Any:
        """Run one step's coroutine on the test's event loop, counting it."""
        type(self).steps += 1
        return self.runner.run(coro)

    def check(self, got: Any, expected: Any) -> None:
        """Compare with the model, strictly (types, -0.0, key order)."""
        if canon(got) != canon(expected):
            type(self).disagreements += 1
        assert canon(got) == canon(expected)

    @rule(which=st.integers(0, 2), batch=st.lists(items, max_size=6))
    def add(self, which: int, batch: list[dict[str, Any]]) -> None:
        """Append a batch to one session."""
        sid = self.ids[which]
        self.run(self.store.session(sid).add_items(copy.deepcopy(batch)))
        self.model[sid].extend(batch)

    @rule(which=st.integers(0, 2), limit=st.none() | st.integers(0, 8))
    def get(self, which: int, limit: int | None) -> None:
        """Read all, or the latest ``limit``, items of one session."""
        sid = self.ids[which]
        got = self.run(self.store.session(sid).get_items(limit=limit))
        expected = self.model[sid] if limit is None else self.model[sid][-limit:] if limit else []
        self.check(got, expected)

    @rule(which=st.integers(0, 2))
    def pop(self, which: int) -> None:
        """Pop the newest item of one session (or None)."""
        sid = self.ids[which]
        got = self.run(self.store.session(sid).pop_item())
        self.check(got, self.model[sid].pop() if self.model[sid] else None)

    @precondition(lambda self: any(self.model.values()))
    @rule(which=st.integers(0, 2))
    def clear(self, which: int) -> None:
        """Clear one session."""
        sid = self.ids[which]
        self.run(self.store.session(sid).clear_session())
        self.model[sid] = []

    @rule(which=st.integers(0, 2), batch_size=st.integers(1, 4))
    def stream(self, which: int, batch_size: int) -> None:
        """Stream every item of one session with iter_items."""
        sid = self.ids[which]

        async def collect() -> list[Any]:
            return [i async for i in self.store.session(sid).iter_items(batch_size=batch_size)]

        self.check(self.run(collect()), self.model[sid])


def test_store_agrees_with_a_list_model(backend: Any, ledger: Ledger) -> None:
    """Random operation sequences on three sessions always agree with the in-memory model."""
    names = fresh_names()
    examples = scaled(25)
    with asyncio.Runner() as runner:
        store = open_store(backend.url, names, create_tables=True)
        machine = type("Machine", (StoreMachine,), {"runner": runner, "store": store})
        try:
            run_state_machine_as_test(
                machine,
                settings=settings(
                    max_examples=examples,
                    stateful_step_count=30,
                    deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
                    database=None,
                ),
            )
        finally:
            ledger.add(
                "Model-based",
                "random add/get(limit)/pop/clear/iter_items sequences on 3 sessions "
                "vs an in-memory model",
                times=machine.steps,
                lost=machine.disagreements,
                unit="operations",
                note=f"{examples} sequences of up to 30 steps",
            )

            async def cleanup() -> None:
                if backend.kind != "sqlite":
                    async with store.engine.begin() as conn:
                        # every table of the set, children first, and its version table
                        for table in (*reversed(names.tables), names.version_table):
                            await conn.execute(DropTable(Table(table, MetaData()), if_exists=True))
                await store.close()

            runner.run(cleanup())
