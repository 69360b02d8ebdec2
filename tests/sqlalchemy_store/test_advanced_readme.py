"""The README's advanced-session example runs as printed and prints what the README says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SECTION = "## Branches, turns and token usage"


def _blocks() -> tuple[str, str]:
    text = (REPO / "README.md").read_text()
    section = text[text.index(SECTION) :]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    printed = re.search(r"prints\n\n```text\n(.*?)```", section, re.DOTALL)
    assert code is not None
    assert printed is not None
    return code.group(1), printed.group(1)


def test_readme_example_runs(tmp_path: Path) -> None:
    """Run the example in a fresh interpreter; its output is the README's, line for line."""
    code, expected = _blocks()
    script = tmp_path / "example.py"
    script.write_text(code)
    done = subprocess.run(  # noqa: S603
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "OPENAI_AGENTS_DISABLE_TRACING": "1"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected
