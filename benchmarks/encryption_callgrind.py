"""``python -m benchmarks.encryption_callgrind MODE OP N``: one store, N operations, for callgrind.

Wall-clock ratios on a shared, loaded machine move by +-0.3 between runs; instruction
counts do not. Run this under ``valgrind --tool=callgrind`` twice per (MODE, OP) with a
small and a large N and subtract: the difference / (N_large - N_small) is the
instructions one operation costs, start-up (imports, engine, schema, the 40 seed items)
cancelled out. Callgrind counts every thread, so SQLite's worker / group-writer threads
are in the total. ``benchmarks/encryption_instructions.sh`` runs the whole table.

* MODE: ``plain`` (no keyring), ``enc`` (``Keyring``, its cache on), ``enc0`` (``cache_size=0``).
* OP: ``read`` (``get_items(limit=20)`` on a 40-item session) or ``append`` (one turn, four items).
"""

from __future__ import annotations

import asyncio
import gc
import sys
import tempfile

from agents_memory import Keyring, SessionStore, create_engine
from benchmarks.items import ItemSource

KEY = "q3pZ0mCk1v0bq7oVQ5Qkq2y0JwzVq0mT3B0cJc9kH0E="


async def run(mode: str, op: str, n: int, tmp: str) -> None:
    """Seed a 40-item session, then ``n`` reads or appends."""
    engine = create_engine(f"sqlite:///{tmp}/cg.db")
    keyring = None
    if mode != "plain":
        keyring = Keyring({"a": KEY}, current="a", cache_size=0 if mode == "enc0" else 1024)
    store = SessionStore(engine, create_tables=True, encryption=keyring)
    source = ItemSource()
    session = store.session("read")
    await session.add_items(source.items(40))
    await session.get_items(limit=20)  # warm: statements compiled, cache filled
    # Start-up's objects out of the collector's sight: otherwise where a full collection
    # falls (it traverses them all) differs between the small and the large run.
    gc.collect()
    gc.freeze()
    try:
        if op == "read":
            for _ in range(n):
                await session.get_items(limit=20)
        else:
            for i in range(n):
                await store.session(f"w-{i % 16}").add_items(source.turn())
    finally:
        await engine.dispose()


def main() -> None:
    """Parse MODE OP N and run."""
    mode, op, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode not in ("plain", "enc", "enc0") or op not in ("read", "append"):
        raise SystemExit(__doc__)
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(mode, op, n, tmp))


if __name__ == "__main__":
    main()
