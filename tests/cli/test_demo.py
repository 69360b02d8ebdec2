"""``agents-memory demo``: the README's first command, through the real console script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent / "agents-memory"


def run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTS_MEMORY_")}
    return subprocess.run(  # noqa: S603 - fixed arguments
        [str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def test_demo_through_the_runner_on_the_embedded_default(tmp_path: Path) -> None:
    """In an empty directory the demo migrates ./agents_memory.db, converses, reads, pops."""
    first = run(BIN, "demo", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    out = first.stdout
    assert "sqlite+aiosqlite:///./agents_memory.db" in out
    assert "schema: migrated from nothing to" in out
    assert "through the Agents SDK Runner" in out
    assert "holds 6 items" in out
    assert "1. user         What's the weather in Paris?" in out
    assert 'tool call    get_weather({"city":"Paris"})' in out
    assert "tool result  18°C, light rain" in out
    assert "get_items(limit=2)" in out
    assert "pop_item() removed the newest: assistant" in out
    assert "now 5 items remain." in out
    assert (tmp_path / "agents_memory.db").is_file()
    again = run(BIN, "demo", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "schema: already at revision" in again.stdout
    assert "holds 6 items" in again.stdout  # the demo session starts afresh each time
    shown = run(BIN, "sessions", "show", "demo", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0].startswith("session 'demo': 5 items")


def test_demo_without_the_agents_sdk(tmp_path: Path) -> None:
    """Without openai-agents the same conversation is written with add_items."""
    code = (
        "import sys; sys.modules['agents'] = None; sys.argv = ['agents-memory', 'demo']; "
        "from agents_memory._cli import main; main()"
    )
    result = run(sys.executable, "-c", code, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "4 add_items calls" in result.stdout
    assert "holds 6 items" in result.stdout
    assert "tool call    get_weather" in result.stdout
    assert "now 5 items remain." in result.stdout
