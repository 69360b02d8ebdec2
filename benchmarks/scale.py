"""How ours scales with conversation length: latest-20 time, and memory of a full read.

``get_items(limit=20)`` must cost about the same on a 1,000-item and a 100,000-item
session (the ``(session_id, id)`` index, read backwards). Streaming a 100,000-item
session with ``iter_items()`` must hold one batch at a time, where ``get_items()``
holds the whole list; peak memory is measured with ``tracemalloc``.
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
import tracemalloc
from typing import Any

from benchmarks.impls import Impl
from benchmarks.workloads import Ctx, check, fill


@dataclasses.dataclass
class ScaleResult:
    """Latest-20 times (median) and peak memory of full reads, for ours."""

    small_items: int
    large_items: int
    small_latest_ms: float
    large_latest_ms: float
    iter_peak_mb: float
    get_peak_mb: float

    @property
    def latest_ratio(self) -> float:
        """Latest-20 time on the large session over the small one (should stay near 1)."""
        return self.large_latest_ms / self.small_latest_ms


async def _latest_ms(session: Any, calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        await session.get_items(limit=20)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


async def _peak_mb(consume: Any) -> tuple[int, float]:
    gc.collect()
    tracemalloc.start()
    try:
        count = await consume()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return count, peak / 1e6


async def run_scale(impl: Impl, ctx: Ctx) -> ScaleResult:
    """Fill a 1,000- and an N-item session through ``impl`` (ours), then measure both."""
    large_n = ctx.sizes.scale_items
    small = impl.session("scale-small")
    large = impl.session("scale-large")
    await fill(small, ctx.items.items(1000), batch=1000)
    for _ in range(large_n // 5000):
        await large.add_items(ctx.items.items(5000))
    check(len(await large.get_items(limit=20)) == 20, "scale session filled")

    await _latest_ms(small, 10)  # warm
    small_ms = await _latest_ms(small, ctx.sizes.scale_calls)
    large_ms = await _latest_ms(large, ctx.sizes.scale_calls)

    async def stream() -> int:
        n = 0
        async for _item in large.iter_items():
            n += 1
        return n

    async def whole() -> int:
        return len(await large.get_items())

    streamed, iter_mb = await _peak_mb(stream)
    loaded, get_mb = await _peak_mb(whole)
    check(streamed == loaded == large_n, "scale session read back whole")
    return ScaleResult(1000, large_n, small_ms, large_ms, iter_mb, get_mb)
