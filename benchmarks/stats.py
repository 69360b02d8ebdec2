"""The benchmarks' one rule for a percentile and for the load they report beside numbers."""

from __future__ import annotations

import os


def percentile(values: list[float], q: float) -> float:
    """The value at fraction ``q`` of ``values`` sorted (nearest rank, no interpolation)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def load_average() -> str:
    """The machine's load average (1, 5, 15 min): other jobs share these CPUs."""
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())
