"""Start-up cost: wall time of a fresh interpreter doing one thing, and what it imports.

``python -m benchmarks.startup [--runs N]``: each case runs N times (median, min) in
a new process; then ``python -X importtime`` shows the heaviest imports of each. Not
a timed test: the numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("agents", "openai", "alembic", "aiosqlite", "asyncpg", "asyncmy", "typer", "rich")

CASES = {
    "python (nothing)": "pass",
    "import agents_memory": "import agents_memory",
    "SQLiteSession round trip": (
        "import asyncio, agents_memory\n"
        "async def main():\n"
        "    with agents_memory.SQLiteSession('u', {db!r}) as s:\n"
        "        await s.add_items([{{'role': 'user', 'content': 'hi'}}])\n"
        "        await s.get_items()\n"
        "asyncio.run(main())"
    ),
    "sessions list (that file)": (
        "import sys\nsys.argv = ['agents-memory', '--url', 'sqlite:///{db}', 'sessions', 'list']\n"
        "from agents_memory._cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass"
    ),
    "agents-memory --help": (
        "import sys\nsys.argv = ['agents-memory', '--help']\n"
        "from agents_memory._cli import main\ntry:\n    main()\nexcept SystemExit:\n    pass"
    ),
    "import agents (the SDK)": "import agents",
}


def _time(code: str, runs: int) -> tuple[float, float, str]:
    took: list[float] = []
    loaded = ""
    probe = f"{code}\nimport sys\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    for _ in range(runs):
        began = time.perf_counter()
        out = subprocess.run(  # noqa: S603 - this interpreter, our own code
            [sys.executable, "-c", probe], capture_output=True, text=True, check=True
        )
        took.append(time.perf_counter() - began)
        loaded = out.stdout.strip().splitlines()[-1]
    return statistics.median(took), min(took), loaded


def _heaviest(code: str, top: int) -> list[tuple[int, str]]:
    """The ``top`` imports by cumulative time, among the first two levels of the import tree."""
    err = subprocess.run(  # noqa: S603 - this interpreter, our own code
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True
    ).stderr
    rows: list[tuple[int, str]] = []
    for line in err.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue  # the header, or output of the code itself
        name = parts[2].rstrip()
        depth = (len(name) - len(name.lstrip()) - 1) // 2  # importtime indents two per level
        if depth <= 1:
            rows.append((int(parts[1]), name.strip()))
    return sorted(rows, reverse=True)[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--top", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "startup.db")
        print(f"{'case':26} {'median s':>9} {'min s':>7}  heavy modules loaded")
        for name, template in CASES.items():
            median, fastest, loaded = _time(template.format(db=db), args.runs)
            print(f"{name:26} {median:9.3f} {fastest:7.3f}  {loaded}")
        print(f"\nheaviest imports (python -X importtime, cumulative, top {args.top}):")
        for name, template in CASES.items():
            if name.startswith("python"):
                continue
            heavy = _heaviest(template.format(db=db), args.top)
            print(f"  {name}: " + ", ".join(f"{mod} {us / 1e6:.2f}s" for us, mod in heavy))
    print(f"\n(python {sys.version.split()[0]}, PYTHONPATH={os.environ.get('PYTHONPATH', '')!r})")


if __name__ == "__main__":
    main()
