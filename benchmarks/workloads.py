"""The workloads of issue 6, each cut into short timed rounds (setup and checks are untimed).

The implementations take turns round by round (a round is a few to a few tens of
milliseconds), so a burst of load from elsewhere on the machine hits all of them
alike instead of whichever happened to be running. Every workload also checks
what it got back, so nothing can look fast by returning the wrong thing.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from typing_extensions import override

from benchmarks.impls import Impl
from benchmarks.items import ItemSource


@dataclasses.dataclass(frozen=True)
class Sizes:
    """How much each workload does; ``--quick`` does fewer repeats and rounds of the same shapes."""

    repeats: int = 5
    seq_sessions: int = 40
    seq_turns: int = 10
    conc_sessions: int = 32
    conc_rounds: int = 5
    burst_sessions: int = 64
    burst_rounds: int = 10
    latest_calls: int = 300
    full_reads: int = 5
    pops: int = 200
    clears: int = 100
    scale_items: int = 100_000
    scale_calls: int = 100

    @classmethod
    def quick(cls) -> Sizes:
        """Fewer repeats and rounds, a 20,000-item scale session (under three minutes in all)."""
        return cls(
            repeats=3,
            seq_turns=5,
            conc_rounds=3,
            burst_rounds=5,
            latest_calls=150,
            full_reads=3,
            pops=100,
            clears=50,
            scale_items=20_000,
            scale_calls=50,
        )


@dataclasses.dataclass
class Ctx:
    """What every workload draws on."""

    items: ItemSource
    sizes: Sizes


class CheckError(AssertionError):
    """An implementation returned something other than what was stored."""


def check(condition: bool, what: str) -> None:
    """Fail the run loudly if an implementation got something wrong."""
    if not condition:
        raise CheckError(what)


async def fill(session: Any, items: list[dict[str, Any]], batch: int = 500) -> None:
    """Append ``items`` in batches (untimed setup)."""
    for start in range(0, len(items), batch):
        await session.add_items(items[start : start + batch])


class Run:
    """One workload on one implementation for one repeat: setup, timed rounds, check."""

    rounds: int

    async def round(self, i: int) -> int:
        """Run round ``i``; the number of operations it did."""
        raise NotImplementedError

    async def check(self) -> None:
        """Verify what the rounds did (untimed)."""


class SeqAppends(Run):
    """Each round, every session gets one turn of 4 items, one session after another."""

    def __init__(self, impl: Impl, ctx: Ctx, rep: int) -> None:
        sz = ctx.sizes
        self.impl = impl
        self.sessions = [impl.session(f"seq-{rep}-{i}") for i in range(sz.seq_sessions)]
        self.turns = [[ctx.items.turn() for _ in self.sessions] for _ in range(sz.seq_turns)]
        self.rounds = sz.seq_turns

    @override
    async def round(self, i: int) -> int:
        for s, items in zip(self.sessions, self.turns[i], strict=True):
            await s.add_items(items)
        return len(self.sessions)

    @override
    async def check(self) -> None:
        want = [i for row in self.turns for i in row[-1]]
        check(await self.sessions[-1].get_items() == want, "sequential appends")
        self.impl.release(self.sessions)


class ConcAppends(Run):
    """Each round, every session appends one turn, all at once."""

    def __init__(self, impl: Impl, ctx: Ctx, rep: int) -> None:
        sz = ctx.sizes
        self.impl = impl
        self.sessions = [impl.session(f"conc-{rep}-{i}") for i in range(sz.conc_sessions)]
        self.turns = [[ctx.items.turn() for _ in self.sessions] for _ in range(sz.conc_rounds)]
        self.rounds = sz.conc_rounds

    @override
    async def round(self, i: int) -> int:
        pairs = zip(self.sessions, self.turns[i], strict=True)
        await asyncio.gather(*(s.add_items(items) for s, items in pairs))
        return len(self.sessions)

    @override
    async def check(self) -> None:
        for k in range(3):
            want = [i for row in self.turns for i in row[k]]
            check(await self.sessions[k].get_items() == want, "concurrent appends")
        self.impl.release(self.sessions)


class Burst(Run):
    """Each round, 64 sessions at once each read their latest 20 items, then append a turn.

    What an agent server sees when many conversations take a turn together: 64
    concurrent operations, more than any pool here holds (10 connections per
    implementation on a server, the same for raw; SQLAlchemy's default 5 + 10 overflow
    for the SQLite engines), so operations queue for a connection, or the pool opens
    and closes overflow connections (churn, counted by the harness). Each session's
    read and append run one after the other, as in a turn; the sessions run together.
    A round is 2 operations per session. The check looks at every session: its last
    read must be exactly its own latest 20 items, and its history every turn in order.
    """

    def __init__(self, impl: Impl, ctx: Ctx, rep: int) -> None:
        sz = ctx.sizes
        self.impl = impl
        self.sessions = [impl.session(f"burst-{rep}-{i}") for i in range(sz.burst_sessions)]
        self.turns = [[ctx.items.turn() for _ in self.sessions] for _ in range(sz.burst_rounds)]
        self.rounds = sz.burst_rounds
        self.done = 0
        self.last_read: list[Any] = [None] * len(self.sessions)

    async def _turn(self, k: int, i: int) -> None:
        session = self.sessions[k]
        self.last_read[k] = await session.get_items(limit=20)
        await session.add_items(self.turns[i][k])

    @override
    async def round(self, i: int) -> int:
        await asyncio.gather(*(self._turn(k, i) for k in range(len(self.sessions))))
        self.done = i + 1
        return 2 * len(self.sessions)

    @override
    async def check(self) -> None:
        for k, session in enumerate(self.sessions):
            history = [item for row in self.turns[: self.done] for item in row[k]]
            before_last = history[: -len(self.turns[self.done - 1][k])]
            check(self.last_read[k] == before_last[-20:], f"burst: latest 20 of session {k}")
            check(await session.get_items() == history, f"burst: history of session {k}")
        self.impl.release(self.sessions)


async def _prefilled(impl: Impl, ctx: Ctx, n: int) -> tuple[Any, list[dict[str, Any]]]:
    """A session holding ``n`` items, filled once per implementation and reused."""
    key = f"prefilled-{n}"
    if key not in impl.state:
        session = impl.session(key)
        items = ctx.items.items(n)
        await fill(session, items)
        impl.state[key] = (session, items)
    return impl.state[key]  # type: ignore[no-any-return]


class Latest(Run):
    """``get_items(limit=20)`` on a prefilled session, a batch of calls per round."""

    size = 0
    per_round = 30

    def __init__(self, impl: Impl, ctx: Ctx, _rep: int) -> None:
        self.impl, self.ctx = impl, ctx
        self.rounds = max(1, ctx.sizes.latest_calls // self.per_round)
        self.got: list[Any] = []

    @override
    async def round(self, _i: int) -> int:
        session, _ = await _prefilled(self.impl, self.ctx, self.size)
        for _ in range(self.per_round):
            self.got = await session.get_items(limit=20)
        return self.per_round

    @override
    async def check(self) -> None:
        _, items = await _prefilled(self.impl, self.ctx, self.size)
        check(self.got == items[-20:], f"latest 20 of {self.size}")


class LatestOf40(Latest):
    """Latest 20 of a 40-item session."""

    size = 40


class LatestOf5000(Latest):
    """Latest 20 of a 5,000-item session."""

    size = 5000


class FullRead(Run):
    """``get_items()`` of a 5,000-item session, one read per round."""

    def __init__(self, impl: Impl, ctx: Ctx, _rep: int) -> None:
        self.impl, self.ctx = impl, ctx
        self.rounds = ctx.sizes.full_reads
        self.got: list[Any] = []

    @override
    async def round(self, _i: int) -> int:
        session, _ = await _prefilled(self.impl, self.ctx, 5000)
        self.got = await session.get_items()
        return 1

    @override
    async def check(self) -> None:
        _, items = await _prefilled(self.impl, self.ctx, 5000)
        check(self.got == items, "full read of 5,000")


class Pop(Run):
    """``pop_item()`` from a prefilled session, 20 per round (untimed refill per repeat)."""

    per_round = 20

    def __init__(self, impl: Impl, ctx: Ctx, rep: int) -> None:
        self.impl = impl
        self.session = impl.session(f"pop-{rep}")
        self.items = ctx.items.items(ctx.sizes.pops)
        self.rounds = max(1, ctx.sizes.pops // self.per_round)
        self.popped: list[Any] = []

    @override
    async def round(self, _i: int) -> int:
        for _ in range(self.per_round):
            self.popped.append(await self.session.pop_item())
        return self.per_round

    @override
    async def check(self) -> None:
        n = len(self.popped)
        check(self.popped == self.items[::-1][:n], "pop order")
        self.impl.release([self.session])


class Clear(Run):
    """``clear_session()`` on sessions of 8 items, 10 per round."""

    per_round = 10

    def __init__(self, impl: Impl, ctx: Ctx, rep: int) -> None:
        self.impl, self.ctx = impl, ctx
        n = ctx.sizes.clears
        self.sessions = [impl.session(f"clear-{rep}-{i}") for i in range(n)]
        self.rounds = max(1, n // self.per_round)

    @override
    async def round(self, i: int) -> int:
        for s in self.sessions[i * self.per_round : (i + 1) * self.per_round]:
            await s.clear_session()
        return self.per_round

    @override
    async def check(self) -> None:
        check(await self.sessions[0].get_items() == [], "clear")
        self.impl.release(self.sessions)


async def _setup(run: Run) -> Run:
    """The untimed part of a run's setup: filling sessions to pop from or clear."""
    if isinstance(run, Pop):
        await fill(run.session, run.items)
    elif isinstance(run, Clear):
        for s in run.sessions:
            await s.add_items(run.ctx.items.turn() + run.ctx.items.turn())
    elif isinstance(run, Latest | FullRead):
        await _prefilled(run.impl, run.ctx, run.size if isinstance(run, Latest) else 5000)
    return run


@dataclasses.dataclass(frozen=True)
class Workload:
    """One row of the table: a key for ``--only``, a title, and how to start a run."""

    key: str
    template: str
    start: Callable[[Impl, Ctx, int], Run]

    def title(self, sizes: Sizes) -> str:
        """The row title with this run's sizes filled in."""
        return self.template.format(**dataclasses.asdict(sizes))

    async def prepare(self, impl: Impl, ctx: Ctx, rep: int) -> Run:
        """Build and set up (untimed) this workload's run for ``impl``."""
        return await _setup(self.start(impl, ctx, rep))


WORKLOADS = (
    Workload(
        "seq_append",
        "sequential appends ({seq_sessions} sessions x {seq_turns} turns of 4 items)",
        SeqAppends,
    ),
    Workload(
        "conc_append",
        "concurrent appends ({conc_sessions} sessions at once x {conc_rounds} rounds)",
        ConcAppends,
    ),
    Workload(
        "burst",
        "burst ({burst_sessions} sessions at once x {burst_rounds} rounds: "
        "latest 20, then append 4 items)",
        Burst,
    ),
    Workload("latest_40", "latest 20 of a 40-item session ({latest_calls} calls)", LatestOf40),
    Workload(
        "latest_5000", "latest 20 of a 5,000-item session ({latest_calls} calls)", LatestOf5000
    ),
    Workload("full_5000", "full read of 5,000 items ({full_reads} reads)", FullRead),
    Workload("pop", "pop ({pops} items)", Pop),
    Workload("clear", "clear ({clears} sessions of 8 items)", Clear),
)
