"""Run every workload on each target in one process and print ops/s and ratios to raw.

Usage (from the repository root)::

    python -m benchmarks                 # full run, every target that answers
    python -m benchmarks --quick         # fewer repetitions (under three minutes)
    python -m benchmarks --targets sqlite --only latest --no-scale

Targets: ``sqlite`` (a file, WAL), ``postgres``, ``pgbouncer`` (Postgres through a
transaction-pooling PgBouncer) and ``mysql`` (MySQL/MariaDB); a server that does not
answer is skipped with the reason. Each repeat runs every workload once per
implementation, rotating the order of the implementations, and the reported figure is
the median over repeats. An implementation that fails is reported as FAILED with the
reason and the run goes on; the exit status is then 1.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import TypeVar

import asyncpg
import sqlalchemy
from sqlalchemy.engine import make_url

import agents_memory
from benchmarks.impls import (
    Database,
    Impl,
    bounded,
    build,
    close_all,
    describe,
    has_agents_sdk,
)
from benchmarks.items import ItemSource
from benchmarks.scale import ScaleResult, run_scale
from benchmarks.workloads import WORKLOADS, Ctx, Run, Sizes, Workload

DEFAULT_PG = os.environ.get(
    "AGENTS_MEMORY_BENCH_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test"
)
DEFAULT_PGBOUNCER = os.environ.get(
    "AGENTS_MEMORY_BENCH_PGBOUNCER_URL", "postgresql://root@127.0.0.1:6432/test"
)
DEFAULT_MYSQL = os.environ.get("AGENTS_MEMORY_BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
COLUMNS = ("raw", "sdk", "stdlib", "ours", "ours_1tx", "ours_part")
TARGETS = ("sqlite", "postgres", "pgbouncer", "mysql")
TITLES = {
    "sqlite": "SQLite (file, WAL)",
    "postgres": "Postgres",
    "pgbouncer": "Postgres through PgBouncer (transaction pooling)",
    "mysql": "MySQL/MariaDB",
}
SHORT = {"sqlite": "SQLite", "postgres": "PG", "pgbouncer": "PgB", "mysql": "MySQL"}
DEFAULT_PORTS = {"postgres": 5432, "pgbouncer": 6432, "mysql": 3306}
T = TypeVar("T")
SCALE_TARGETS = ("sqlite", "postgres", "mysql")
"""The at-scale table is not repeated through PgBouncer: same server, same data as Postgres."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions (under three minutes)")
    p.add_argument(
        "--targets",
        "--db",
        dest="targets",
        default=",".join(TARGETS),
        help="comma-separated, run in this order: sqlite,postgres,pgbouncer,mysql (the default: "
        "all; a server that does not answer is skipped with the reason). --db is the old name",
    )
    p.add_argument("--postgres-url", default=DEFAULT_PG)
    p.add_argument(
        "--pgbouncer-url",
        default=DEFAULT_PGBOUNCER,
        help="a PgBouncer in transaction pooling mode in front of Postgres",
    )
    p.add_argument("--mysql-url", default=DEFAULT_MYSQL)
    p.add_argument("--repeats", type=int, help="override the number of repeats (median)")
    p.add_argument("--only", default="", help="run workloads whose key contains this text")
    p.add_argument("--no-peers", action="store_true", help="skip the Agents SDK's classes")
    p.add_argument(
        "--no-scale",
        action="store_true",
        help="skip the at-scale table (100,000 items; 20,000 quick)",
    )
    p.add_argument(
        "--ungrouped",
        action="store_true",
        help="on SQLite, also run ours with group commit off (column ours_1tx)",
    )
    p.add_argument(
        "--partitioned",
        type=int,
        metavar="N",
        help="on Postgres and PgBouncer, also run ours with N hash partitions (column ours_part)",
    )
    p.add_argument("--json", type=Path, help="also write every measurement to this file")
    p.add_argument(
        "--step-timeout",
        type=float,
        default=120.0,
        help="seconds any one step (setup, warm-up, timed round, check, close) may take before "
        "that implementation is failed (default 120)",
    )
    p.add_argument(
        "--cpu",
        type=int,
        default=1,
        help="pin this process to that many CPUs (default 1; -1: no pinning)",
    )
    return p.parse_args(argv)


def pin_cpus(count: int) -> str:
    """Pin the process to ``count`` CPUs and say what was done.

    With the event loop, driver threads and the database server free to migrate
    between a few shared cores, repeats differ by more than the effects measured.
    Pinned, every implementation runs under the same constraint, one at a time,
    and the ratios are steady; the server stays unpinned.
    """
    if count < 1:
        return "not pinned"
    setaffinity = getattr(os, "sched_setaffinity", None)
    if setaffinity is None:
        return "not pinned (no sched_setaffinity on this platform)"
    available = sorted(os.sched_getaffinity(0))
    chosen = set(available[-count:])
    setaffinity(0, chosen)
    return f"pinned to CPU {','.join(map(str, sorted(chosen)))}"


def _server_answers(url: str, default_port: int) -> str | None:
    parsed = make_url(url)
    host, port = parsed.host or "127.0.0.1", parsed.port or default_port
    try:
        with socket.create_connection((host, port), timeout=2):
            return None
    except OSError as exc:
        return f"no server at {host}:{port} ({exc})"


async def _pgbouncer_reconnect(url: str) -> str:
    """Ask PgBouncer's admin console for fresh server connections to the target database.

    In transaction pooling PgBouncer resets nothing between clients, so a server
    connection keeps the prepared statements earlier clients left on it (earlier runs
    of this harness included), which changes how a store that prepares named
    statements behaves. ``RECONNECT db`` closes each server connection once it is
    released, so every run starts from the same state (and leaves none behind).
    Best effort: the admin console needs the user in ``admin_users``.
    """
    parsed = make_url(url)
    admin = parsed.set(database="pgbouncer").render_as_string(hide_password=False)
    command = f"RECONNECT {parsed.database}" if parsed.database else "RECONNECT"
    try:
        conn = await asyncio.wait_for(asyncpg.connect(admin, statement_cache_size=0), 10)
        try:
            await asyncio.wait_for(conn.execute(command), 10)  # simple protocol, as it needs
        finally:
            await conn.close()
    except Exception as exc:
        return (
            f"could not {command} through the admin console ({describe(exc)}): server "
            "connections may hold prepared statements left by earlier clients"
        )
    return f"{command} through the admin console: fresh server connections"


@dataclasses.dataclass
class Failure:
    """An implementation (or a whole target) that stopped being measured, and why."""

    target: str
    impl: str
    where: str
    """Setup, or the workload, repeat and step it failed in."""
    error: str


@dataclasses.dataclass
class TargetResult:
    """Everything measured on one target."""

    impls: list[str]
    """Column keys, in build order (failed ones included)."""
    ops: dict[str, dict[str, list[float]]]
    """Workload key -> implementation key -> ops/s, one per repeat completed."""
    opened: dict[str, dict[str, list[int]]]
    """Workload key -> implementation key -> connections opened during its timed rounds."""
    failed: dict[str, str] = dataclasses.field(default_factory=dict)
    """Implementation key -> the reason it was dropped."""
    scale: ScaleResult | None = None


class TargetFailedError(Exception):
    """The raw baseline failed: nothing on this target can be compared."""


class TargetRun:
    """One target's run: builds the implementations, runs the repeats, records failures."""

    def __init__(
        self, db: Database, ctx: Ctx, args: argparse.Namespace, failures: list[Failure]
    ) -> None:
        self.db, self.ctx, self.args, self.failures = db, ctx, args, failures
        self.spent: dict[str, float] = {}

    async def step(self, impl: Impl, what: str, step: Awaitable[T]) -> tuple[bool, T | None]:
        """Run one step of ``impl``; on failure mark it failed (raw: fail the target)."""
        try:
            return True, await bounded(step, self.args.step_timeout, f"{impl.key}: {what}")
        except Exception as exc:
            impl.failure, impl.failed_in = describe(exc), what
            self.failures.append(Failure(self.db.key, impl.key, what, impl.failure))
            if impl.key == "raw":
                raise TargetFailedError(impl.failure) from exc
            return False, None

    async def run(self, workloads: list[Workload]) -> TargetResult:
        """All repeats of all workloads; ops/s per workload per implementation."""
        db, ctx, args = self.db, self.ctx, self.args
        try:
            impls = await build(
                db,
                ctx.items,
                peers=not args.no_peers,
                step_seconds=args.step_timeout,
                ungrouped=args.ungrouped,
                partitioned=args.partitioned,
            )
        except BaseException:
            await db.drop_tables()  # those created before the failure
            raise
        self.failures.extend(
            Failure(db.key, i.key, i.failed_in, i.failure) for i in impls if i.failure is not None
        )
        result = TargetResult(
            [i.key for i in impls], {w.key: {} for w in workloads}, {w.key: {} for w in workloads}
        )
        started = time.perf_counter()
        gc.collect()
        gc.freeze()  # setup's objects: collections during the rounds then only see new ones
        try:
            for rep in range(ctx.sizes.repeats):
                for w in workloads:
                    await self.workload(w, rep, impls, result)
                print(
                    f"  {db.key}: repeat {rep + 1}/{ctx.sizes.repeats} done "
                    f"({time.perf_counter() - started:.0f} s)",
                    file=sys.stderr,
                )
            ours = next((i for i in impls if i.key == "ours" and i.failure is None), None)
            if not args.no_scale and db.key in SCALE_TARGETS and ours is not None:
                t0 = time.perf_counter()
                _, result.scale = await self.step(ours, "at scale", run_scale(ours, ctx))
                self.spent["scale"] = time.perf_counter() - t0
            print(
                f"  {db.key}: seconds spent: "
                + ", ".join(f"{k} {v:.0f}" for k, v in self.spent.items()),
                file=sys.stderr,
            )
        finally:
            gc.unfreeze()
            result.failed = {i.key: i.failure for i in impls if i.failure is not None}
            await close_all(impls, args.step_timeout)
            await db.drop_tables()
        return result

    async def workload(self, w: Workload, rep: int, impls: list[Impl], res: TargetResult) -> None:
        """One repeat of one workload: every live implementation, taking turns round by round."""
        where = f"{w.key}, repeat {rep + 1}"
        live: list[tuple[Impl, Run]] = []
        for impl in impls:
            if impl.failure is None:
                ok, run = await self.step(impl, f"{where}, setup", w.prepare(impl, self.ctx, rep))
                if ok and run is not None:
                    live.append((impl, run))
        if not live:
            return
        opened_before = [impl.opened() if impl.opened else 0 for impl, _ in live]
        ops, seconds = await self.rounds(where, rep, live)
        for k, (impl, run) in enumerate(live):
            if impl.failure is not None:
                continue
            opened = impl.opened() - opened_before[k] if impl.opened else None
            ok, _ = await self.step(impl, f"{where}, check", run.check())
            if not ok:
                continue
            res.ops[w.key].setdefault(impl.key, []).append(ops[k] / seconds[k])
            if opened is not None:
                res.opened[w.key].setdefault(impl.key, []).append(opened)
            self.spent[impl.key] = self.spent.get(impl.key, 0.0) + seconds[k]

    async def rounds(
        self, where: str, rep: int, live: list[tuple[Impl, Run]]
    ) -> tuple[list[int], list[float]]:
        """The timed rounds, implementations taking turns; operations and seconds of each."""
        ops = [0] * len(live)
        seconds = [0.0] * len(live)
        for i in range(live[0][1].rounds):
            shift = (rep + i) % len(live)  # take turns, rotating who goes first
            for k in [*range(shift, len(live)), *range(shift)]:
                impl, run = live[k]
                if impl.failure is not None:
                    continue
                t0 = time.perf_counter()
                _, done = await self.step(impl, f"{where}, round {i + 1}", run.round(i))
                ops[k] += done or 0
                seconds[k] += time.perf_counter() - t0
        return ops, seconds


def _median(values: list[float] | None) -> float | None:
    return statistics.median(values) if values else None


def _ratio(per_impl: dict[str, list[float]], impl: str) -> float | None:
    """Median over repeats of impl/raw within the same repeat (paired, so drifts cancel).

    Both lists start at the first repeat; an implementation that failed part-way has
    fewer, and is paired with raw's first ones (the same repeats).
    """
    raw, mine = per_impl.get("raw"), per_impl.get(impl)
    if not raw or not mine:
        return None
    return statistics.median(m / r for m, r in zip(mine, raw, strict=False))


def _cell(res: TargetResult, w: Workload, c: str, repeats: int, *, with_ops: bool) -> str:
    values = res.ops[w.key].get(c)
    if not values:
        return "FAILED" if c in res.failed else "-"
    ratio = _ratio(res.ops[w.key], c)
    text = f"{_median(values):,.0f} ({ratio:.2f})" if with_ops else f"{ratio:.2f}"
    return text + ("†" if len(values) < repeats else "")


def print_table(db_key: str, workloads: list[Workload], res: TargetResult, sizes: Sizes) -> None:
    present = [c for c in COLUMNS if c in res.impls]
    print(f"\n## {TITLES[db_key]}: ops/s (median), ratio to raw in brackets\n")
    print("| workload | " + " | ".join(present) + " |")
    print("|---|" + "---:|" * len(present))
    for w in workloads:
        cells = [_cell(res, w, c, sizes.repeats, with_ops=True) for c in present]
        print(f"| {w.title(sizes)} | " + " | ".join(cells) + " |")
    churn = [w for w in workloads if any(v and max(v) for v in res.opened[w.key].values())]
    burst = [w for w in workloads if w.key == "burst"]
    for w in dict.fromkeys(burst + churn):
        counts = ", ".join(
            f"{c} {statistics.median(res.opened[w.key][c]):g}"
            if res.opened[w.key].get(c)
            else f"{c} -"
            for c in present
        )
        print(
            f"\nConnections opened during the timed rounds of {w.key} (median per repeat): {counts}"
        )


def print_ratio_table(
    workloads: list[Workload], all_res: dict[str, TargetResult], sizes: Sizes
) -> None:
    """The README table: ratio to raw per implementation, every target side by side."""
    cols = [
        (db_key, c)
        for db_key, res in all_res.items()
        for c in COLUMNS
        if c in res.impls and c != "raw"
    ]
    if not cols:
        return
    print("\n## Ratio to the raw driver (median over repeats of ops/s ÷ raw ops/s)\n")
    print("| workload | " + " | ".join(f"{SHORT[d]} {c}" for d, c in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for w in workloads:
        cells = [_cell(all_res[d], w, c, sizes.repeats, with_ops=False) for d, c in cols]
        print(f"| {w.title(sizes)} | " + " | ".join(cells) + " |")


def print_scale(scales: dict[str, ScaleResult]) -> None:
    if not scales:
        return
    print("\n## Ours at scale\n")
    print(
        "| database | latest 20 of 1,000 | latest 20 of N | ratio | "
        "peak memory, iter_items() | peak memory, get_items() |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for db_key, s in scales.items():
        print(
            f"| {TITLES[db_key]} (N = {s.large_items:,}) | {s.small_latest_ms:.3f} ms | "
            f"{s.large_latest_ms:.3f} ms | {s.latest_ratio:.2f} | {s.iter_peak_mb:.1f} MB | "
            f"{s.get_peak_mb:.1f} MB |"
        )


def print_failures(failures: list[Failure], skipped: dict[str, str]) -> None:
    if skipped:
        print("\n## Skipped targets\n")
        for key, reason in skipped.items():
            print(f"- {TITLES[key]}: {reason}")
    if not failures:
        return
    print("\n## FAILURES\n")
    print("FAILED: dropped from that point on; † a figure over fewer repeats (it failed later).")
    for f in failures:
        print(f"- {TITLES[f.target]}, {f.impl}, {f.where}: {f.error}")


def _url(args: argparse.Namespace, key: str) -> str:
    urls: dict[str, str] = {
        "postgres": args.postgres_url,
        "pgbouncer": args.pgbouncer_url,
        "mysql": args.mysql_url,
    }
    return urls[key]


async def _run_target(
    key: str, tag: str, ctx: Ctx, workloads: list[Workload], args: argparse.Namespace
) -> tuple[TargetResult | None, list[Failure]]:
    """Run one target; its result (None if the raw baseline failed) and its failures."""
    failures: list[Failure] = []
    try:
        if key == "sqlite":
            with tempfile.TemporaryDirectory(prefix="agents-memory-bench-") as tmp:
                db = Database("sqlite", TITLES["sqlite"], tag, directory=Path(tmp))
                return await TargetRun(db, ctx, args, failures).run(workloads), failures
        url = _url(args, key)
        db = Database(key, TITLES[key], tag, url=url)
        if key != "pgbouncer":
            return await TargetRun(db, ctx, args, failures).run(workloads), failures
        print(f"\n{TITLES[key]}: {await _pgbouncer_reconnect(url)}")
        try:
            return await TargetRun(db, ctx, args, failures).run(workloads), failures
        finally:
            await _pgbouncer_reconnect(url)  # leave no prepared statements behind
    except Exception as exc:
        if not isinstance(exc, TargetFailedError):
            failures.append(Failure(key, "raw", "setup or warm-up", describe(exc)))
        return None, failures


async def main_async(args: argparse.Namespace) -> int:
    sizes = Sizes.quick() if args.quick else Sizes()
    if args.repeats:
        sizes = Sizes(**{**sizes.__dict__, "repeats": args.repeats})
    targets = [d.strip() for d in args.targets.split(",") if d.strip()]
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        print(f"unknown target(s) {', '.join(unknown)}: use {', '.join(TARGETS)}")
        return 2
    workloads = [w for w in WORKLOADS if args.only in w.key]
    ctx = Ctx(ItemSource(), sizes)
    tag = uuid.uuid4().hex[:8]
    pinned = pin_cpus(args.cpu)
    print(
        f"agents_memory {agents_memory.__version__}, SQLAlchemy {sqlalchemy.__version__}, "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs ({pinned}); "
        f"items {ctx.items.mean_bytes():.0f} bytes on average; "
        f"{sizes.repeats} repeats{' (quick)' if args.quick else ''}; "
        f"peers {'installed' if has_agents_sdk() else 'not installed'}",
    )
    all_res: dict[str, TargetResult] = {}
    scales: dict[str, ScaleResult] = {}
    failures: list[Failure] = []
    skipped: dict[str, str] = {}
    started = time.perf_counter()
    for key in targets:
        if key != "sqlite":
            reason = _server_answers(_url(args, key), DEFAULT_PORTS[key])
            if reason:
                skipped[key] = f"{reason}; pass --{key}-url or leave it out of --targets"
                print(f"skipping {TITLES[key]}: {skipped[key]}")
                continue
        res, failed = await _run_target(key, tag, ctx, workloads, args)
        failures.extend(failed)
        if res is None:
            print(f"\n## {TITLES[key]}: FAILED (raw baseline: {failed[-1].error})")
            continue
        all_res[key] = res
        if res.scale is not None:
            scales[key] = res.scale
        print_table(key, workloads, res, sizes)
    print_ratio_table(workloads, all_res, sizes)
    print_scale(scales)
    print_failures(failures, skipped)
    print(f"\n(total {time.perf_counter() - started:.0f} s)")
    if args.json:
        payload = {
            "ops_per_s": {k: v.ops for k, v in all_res.items()},
            "connections_opened": {k: v.opened for k, v in all_res.items()},
            "scale": {k: v.__dict__ for k, v in scales.items()},
            "sizes": sizes.__dict__,
            "failures": [f.__dict__ for f in failures],
            "skipped": skipped,
        }
        args.json.write_text(json.dumps(payload, indent=2))
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(main_async(parse_args(argv)))
