"""Run every workload on SQLite and Postgres in one process and print ops/s and ratios to raw.

Usage (from the repository root)::

    python -m benchmarks                 # full run, both databases (a few minutes)
    python -m benchmarks --quick         # fewer repetitions (about a minute)
    python -m benchmarks --db sqlite --only latest --no-scale

Each repeat runs every workload once per implementation, rotating the order of the
implementations, and the reported figure is the median over repeats.
"""

from __future__ import annotations

import argparse
import asyncio
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
from pathlib import Path
from typing import Any

import sqlalchemy
from sqlalchemy.engine import make_url

import agents_memory
from benchmarks.impls import Database, Impl, build, close_all, has_agents_sdk
from benchmarks.items import ItemSource
from benchmarks.scale import ScaleResult, run_scale
from benchmarks.workloads import WORKLOADS, Ctx, Sizes, Workload

DEFAULT_PG = os.environ.get(
    "AGENTS_MEMORY_BENCH_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test"
)
COLUMNS = ("raw", "sdk", "stdlib", "ours")
DEFAULT_MYSQL = os.environ.get("AGENTS_MEMORY_BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
TITLES = {"sqlite": "SQLite (file, WAL)", "postgres": "Postgres", "mysql": "MySQL/MariaDB"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions (about a minute)")
    p.add_argument(
        "--db", default="sqlite,postgres,mysql", help="comma-separated: sqlite,postgres,mysql"
    )
    p.add_argument("--postgres-url", default=DEFAULT_PG)
    p.add_argument("--mysql-url", default=DEFAULT_MYSQL)
    p.add_argument("--repeats", type=int, help="override the number of repeats (median)")
    p.add_argument("--only", default="", help="run workloads whose key contains this text")
    p.add_argument("--no-peers", action="store_true", help="skip the Agents SDK's classes")
    p.add_argument("--no-scale", action="store_true", help="skip the 100k-item measurements")
    p.add_argument("--json", type=Path, help="also write every measurement to this file")
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


async def run_database(
    db: Database, ctx: Ctx, workloads: list[Workload], args: argparse.Namespace
) -> tuple[dict[str, dict[str, list[float]]], ScaleResult | None]:
    """All repeats of all workloads on one database; ops/s per workload per implementation."""
    impls: list[Impl] = await build(db, ctx.items, peers=not args.no_peers)
    results: dict[str, dict[str, list[float]]] = {w.key: {} for w in workloads}
    spent: dict[str, float] = {}
    scale = None
    started = time.perf_counter()
    gc.collect()
    gc.freeze()  # setup's objects: collections during the rounds then only see new ones
    try:
        for rep in range(ctx.sizes.repeats):
            for w in workloads:
                runs = [await w.prepare(impl, ctx, rep) for impl in impls]
                ops = [0] * len(impls)
                seconds = [0.0] * len(impls)
                for i in range(runs[0].rounds):
                    shift = (rep + i) % len(impls)  # take turns, rotating who goes first
                    for k in [*range(shift, len(impls)), *range(shift)]:
                        t0 = time.perf_counter()
                        ops[k] += await runs[k].round(i)
                        seconds[k] += time.perf_counter() - t0
                for k, impl in enumerate(impls):
                    await runs[k].check()
                    results[w.key].setdefault(impl.key, []).append(ops[k] / seconds[k])
                    spent[impl.key] = spent.get(impl.key, 0.0) + seconds[k]
            print(
                f"  {db.key}: repeat {rep + 1}/{ctx.sizes.repeats} done "
                f"({time.perf_counter() - started:.0f} s)",
                file=sys.stderr,
            )
        if not args.no_scale:
            ours = next(i for i in impls if i.key == "ours")
            t0 = time.perf_counter()
            scale = await run_scale(ours, ctx)
            spent["scale"] = time.perf_counter() - t0
        print(
            f"  {db.key}: seconds spent: " + ", ".join(f"{k} {v:.0f}" for k, v in spent.items()),
            file=sys.stderr,
        )
    finally:
        gc.unfreeze()
        await close_all(impls)
        await db.drop_tables()
    return results, scale


def _median(values: list[float] | None) -> float | None:
    return statistics.median(values) if values else None


def _ratio(per_impl: dict[str, list[float]], impl: str) -> float | None:
    """Median over repeats of impl/raw within the same repeat (paired, so drifts cancel)."""
    raw, mine = per_impl.get("raw"), per_impl.get(impl)
    if not raw or not mine:
        return None
    return statistics.median(m / r for m, r in zip(mine, raw, strict=True))


def print_table(
    db_key: str, workloads: list[Workload], res: dict[str, dict[str, list[float]]], sizes: Sizes
) -> None:
    present = [c for c in COLUMNS if any(c in res[w.key] for w in workloads)]
    print(f"\n## {TITLES[db_key]}: ops/s (median), ratio to raw in brackets\n")
    print("| workload | " + " | ".join(present) + " |")
    print("|---|" + "---:|" * len(present))
    for w in workloads:
        cells = []
        for c in present:
            v = _median(res[w.key].get(c))
            ratio = _ratio(res[w.key], c)
            if v is None:
                cells.append("-")
            elif ratio is not None:
                cells.append(f"{v:,.0f} ({ratio:.2f})")
            else:
                cells.append(f"{v:,.0f}")
        print(f"| {w.title(sizes)} | " + " | ".join(cells) + " |")


def print_ratio_table(workloads: list[Workload], all_res: dict[str, Any], sizes: Sizes) -> None:
    """The README table: ratio to raw per implementation, both databases side by side."""
    cols = [
        (db_key, c)
        for db_key, res in all_res.items()
        for c in COLUMNS
        if any(c in res[w.key] for w in workloads)
    ]
    if not cols:
        return
    short = {"sqlite": "SQLite", "postgres": "PG", "mysql": "MySQL"}
    print("\n## Ratio to the raw driver (median over repeats of ops/s ÷ raw ops/s)\n")
    print("| workload | " + " | ".join(f"{short[d]} {c}" for d, c in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for w in workloads:
        cells = []
        for d, c in cols:
            ratio = _ratio(all_res[d][w.key], c)
            cells.append("-" if ratio is None else f"{ratio:.2f}")
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


async def main_async(args: argparse.Namespace) -> int:
    sizes = Sizes.quick() if args.quick else Sizes()
    if args.repeats:
        sizes = Sizes(**{**sizes.__dict__, "repeats": args.repeats})
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
    all_res: dict[str, Any] = {}
    scales: dict[str, ScaleResult] = {}
    started = time.perf_counter()
    for db_key in [d.strip() for d in args.db.split(",") if d.strip()]:
        if db_key in ("postgres", "mysql"):
            url = args.postgres_url if db_key == "postgres" else args.mysql_url
            reason = _server_answers(url, 5432 if db_key == "postgres" else 3306)
            if reason:
                print(f"skipping {TITLES[db_key]}: {reason}; pass --{db_key}-url or leave it out")
                continue
            db = Database(db_key, TITLES[db_key], tag, postgres_url=url)
            res, scale = await run_database(db, ctx, workloads, args)
        elif db_key == "sqlite":
            with tempfile.TemporaryDirectory(prefix="agents-memory-bench-") as tmp:
                db = Database("sqlite", TITLES["sqlite"], tag, directory=Path(tmp))
                res, scale = await run_database(db, ctx, workloads, args)
        else:
            print(f"unknown database {db_key!r}: use sqlite, postgres and/or mysql")
            return 2
        all_res[db_key] = res
        if scale is not None:
            scales[db_key] = scale
        print_table(db_key, workloads, res, sizes)
    print_ratio_table(workloads, all_res, sizes)
    print_scale(scales)
    print(f"\n(total {time.perf_counter() - started:.0f} s)")
    if args.json:
        payload = {
            "ops_per_s": all_res,
            "scale": {k: v.__dict__ for k, v in scales.items()},
            "sizes": sizes.__dict__,
        }
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(main_async(parse_args(argv)))
