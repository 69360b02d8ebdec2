"""The README's first steps, run as written: the "Use it" snippet and the sample errors."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
BIN = Path(sys.executable).parent / "agents-memory"

pytestmark = pytest.mark.skipif(not README.is_file(), reason="needs the source checkout")


def use_it() -> tuple[str, str]:
    """The step the "Use it" section states, and its first code block."""
    section = README.read_text().split("## Use it", 1)[1]
    step = re.search(r"`(agents-memory db upgrade --url sqlite:///memory\.db)`", section)
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert step is not None
    assert code is not None
    return step.group(1), code.group(1)


PROBE = """
import asyncio
{snippet}
async def main():
    try:
        print(await store.session("u1").get_items())
    except Exception as exc:
        print(type(exc).__name__, exc)
    finally:
        await store.close()
asyncio.run(main())
"""


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - fixed argument lists
        args,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, "AGENTS_MEMORY_URL": ""},
    )


def test_use_it_snippet_after_the_stated_step(tmp_path: Path) -> None:
    """Pasted first: SchemaNotReadyError naming the step, no file; after the step it works."""
    pytest.importorskip("agents", reason="the snippet imports the Agents SDK")
    step, snippet = use_it()
    probe = PROBE.format(snippet=snippet)
    first = run([sys.executable, "-c", probe], tmp_path)
    assert first.stdout.startswith("SchemaNotReadyError"), first.stdout + first.stderr
    assert "agents-memory db upgrade --url" in first.stdout
    assert not (tmp_path / "memory.db").exists()  # a failed read leaves no file behind
    command = shlex.split(step)
    done = run([str(BIN), *command[1:]], tmp_path)
    assert done.returncode == 0, done.stderr
    second = run([sys.executable, "-c", probe], tmp_path)
    assert second.stdout.strip() == "[]", second.stdout + second.stderr


@pytest.mark.parametrize(
    "command",
    [
        "--url postgresql://root:s3cret@127.0.0.1:5999/prod sessions list",
        "--url sqlite:///other.db sessions list",
    ],
)
def test_readme_sample_errors_are_the_real_ones(tmp_path: Path, command: str) -> None:
    """The README's sample error lines are what the command prints today."""
    text = README.read_text()
    sample = text.split(f"$ agents-memory {command}\n", 1)[1].splitlines()[0]
    result = run([str(BIN), *shlex.split(command)], tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip() == sample
