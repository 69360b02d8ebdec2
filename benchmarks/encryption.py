"""``python -m benchmarks.encryption``: what encryption at rest costs, and how fast rotation runs.

For each target (SQLite file, Postgres; MySQL on request) two stores of ours on
one engine, one plain and one with ``encryption=Keyring(...)``, run the same
workloads in alternating rounds (so drift on a shared machine hits both alike):

* **append**: sequential ``add_items`` of one agent turn (four realistic items,
  ~840 bytes each) to its own sessions;
* **latest-20**: ``get_items(limit=20)`` on a 200-item session.

The encrypted store runs twice: with the keyring's cache of opened envelopes (the
default, ``cache_size=1024``) and with ``cache_size=0`` (every read decrypts).
It reports ops/s (median of the rounds) and the ratio encrypted / plain, then
**rotation**: ``store.rotate_keys`` re-encrypting N items from one key to
another (batches of 500), in items/s.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from agents_memory import Keyring, SessionStore, TableNames, create_engine
from benchmarks.items import ItemSource
from benchmarks.run import pin_cpus

URLS = {
    "sqlite": "sqlite:///{tmp}/enc_bench.db",
    "postgres": "postgresql://root@127.0.0.1:5432/test",
    "mysql": "mysql://root@127.0.0.1:3306/test",
}


async def _rate(op: Callable[[int], Awaitable[Any]], n: int) -> float:
    started = time.perf_counter()
    for i in range(n):
        await op(i)
    return n / (time.perf_counter() - started)


async def _drop(store: SessionStore) -> None:
    from sqlalchemy import MetaData, Table  # noqa: PLC0415
    from sqlalchemy.schema import DropTable  # noqa: PLC0415

    names = store.table_names
    async with store.engine.begin() as conn:
        for table in (*reversed(names.tables), names.version_table):
            await conn.execute(DropTable(Table(table, MetaData()), if_exists=True))


async def bench_target(
    target: str, url: str, *, rounds: int, n_append: int, n_read: int, n_rotate: int
) -> dict[str, Any]:
    """Append and latest-20 plain vs encrypted, then rotation throughput, on one target."""
    engine = create_engine(url)
    tag = uuid.uuid4().hex[:8]
    names = TableNames(f"enc{tag}_s", f"enc{tag}_m")
    keys = {"a": Keyring.generate_key(), "b": Keyring.generate_key()}
    keyring = Keyring(keys, current="a")
    nocache = Keyring(keys, current="a", cache_size=0)
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    plain = SessionStore(engine, create_tables=True, **kw)
    enc = SessionStore(engine, encryption=keyring, **kw)
    enc0 = SessionStore(engine, encryption=nocache, **kw)
    source = ItemSource()
    labels = ("plain", "enc", "enc0")
    rates: dict[str, dict[str, list[float]]] = {
        "append": {label: [] for label in labels},
        "latest-20": {label: [] for label in labels},
    }
    stores = ((plain, "plain"), (enc, "enc"), (enc0, "enc0"))
    try:
        for store, label in stores:
            items = [item for _ in range(50) for item in source.turn()]
            await store.session(f"read-{label}").add_items(items)
        for r in range(rounds):
            for store, label in stores:

                async def append(
                    i: int, store: SessionStore = store, lb: str = label, rn: int = r
                ) -> None:
                    await store.session(f"w-{lb}-{rn}-{i % 16}").add_items(source.turn())

                async def read(_i: int, store: SessionStore = store, lb: str = label) -> None:
                    await store.session(f"read-{lb}").get_items(limit=20)

                rates["append"][label].append(await _rate(append, n_append))
                rates["latest-20"][label].append(await _rate(read, n_read))
        # rotation: n_rotate items under key a, re-encrypted to b
        rot = SessionStore(engine, encryption=keyring, **kw)
        for s in range(n_rotate // 400):
            await rot.session(f"rot-{s}").add_items(
                [item for _ in range(100) for item in source.turn()]
            )
        pending = (await rot.rotate_keys("b", dry_run=True)).remaining
        started = time.perf_counter()
        report = await rot.rotate_keys("b", batch_size=500)
        took = time.perf_counter() - started
    finally:
        await _drop(plain)
        await engine.dispose()
    out: dict[str, Any] = {"target": target}
    for workload, by in rates.items():
        p, e, e0 = (statistics.median(by[label]) for label in labels)
        out[workload] = {"plain": p, "enc": e, "ratio": e / p, "enc0": e0, "ratio0": e0 / p}
    out["rotation"] = {"items": report.rotated, "pending": pending, "items_per_s": pending / took}
    return out


def main() -> None:
    """Run the comparison and print a table."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.encryption", description=__doc__)
    parser.add_argument("--targets", default="sqlite,postgres")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--appends", type=int, default=200, help="add_items calls per round")
    parser.add_argument("--reads", type=int, default=500, help="get_items calls per round")
    parser.add_argument("--rotate", type=int, default=20_000, help="items to rotate")
    parser.add_argument("--cpu", type=int, default=1)
    args = parser.parse_args()
    print(pin_cpus(args.cpu))
    import tempfile  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as tmp:
        print(
            "| target | workload | plain ops/s | encrypted ops/s | ratio "
            "| encrypted, cache_size=0 | ratio |\n|---|---|---:|---:|---:|---:|---:|"
        )
        rotations = []
        for target in args.targets.split(","):
            url = URLS[target].format(tmp=tmp)
            result = asyncio.run(
                bench_target(
                    target,
                    url,
                    rounds=args.rounds,
                    n_append=args.appends,
                    n_read=args.reads,
                    n_rotate=args.rotate,
                )
            )
            for workload in ("append", "latest-20"):
                w = result[workload]
                print(
                    f"| {target} | {workload} | {w['plain']:,.0f} | {w['enc']:,.0f} "
                    f"| {w['ratio']:.2f} | {w['enc0']:,.0f} | {w['ratio0']:.2f} |"
                )
            rotations.append((target, result["rotation"]))
        print("\n| target | items rotated | items/s |\n|---|---:|---:|")
        for target, rot in rotations:
            print(f"| {target} | {rot['items']:,} | {rot['items_per_s']:,.0f} |")


if __name__ == "__main__":
    main()
