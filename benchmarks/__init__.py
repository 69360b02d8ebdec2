"""Side-by-side benchmarks: ours vs the raw async drivers and the Agents SDK's stores."""
