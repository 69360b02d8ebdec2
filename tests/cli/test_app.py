"""The command itself: version, help with examples, exit codes, errors without secrets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agents_memory import __version__
from agents_memory._cli import app

BIN = Path(sys.executable).parent / "agents-memory"
COMMANDS = [
    [],
    ["demo"],
    ["db"],
    ["db", "upgrade"],
    ["db", "downgrade"],
    ["db", "current"],
    ["db", "check"],
    ["db", "history"],
    ["sessions"],
    ["sessions", "list"],
    ["sessions", "show"],
    ["sessions", "delete"],
    ["sessions", "stats"],
    ["sessions", "prune"],
    ["keys"],
    ["keys", "rotate"],
    ["export"],
    ["import"],
    ["copy"],
]


def invoke(*args: str, tmp: Path | None = None):
    env = {"AGENTS_MEMORY_URL": None, "COLUMNS": "200"}
    return CliRunner().invoke(app, list(args), env=env)


def test_version() -> None:
    """--version prints the package version and exits 0."""
    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.strip() == f"agents-memory {__version__}"


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) or "root" for c in COMMANDS])
def test_help_on_every_level_has_examples(command: list[str]) -> None:
    """Every group and command answers --help with a description and examples."""
    result = invoke(*command, "--help")
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.stdout
    assert "Examples" in result.stdout
    assert f"agents-memory {' '.join(command)}".strip() in result.stdout


def _all_commands() -> list[list[str]]:
    """Every group and command of the real tree (new commands are covered without a list)."""
    import typer.main  # noqa: PLC0415

    found: list[list[str]] = []

    def walk(command: object, path: list[str]) -> None:
        found.append(path)
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


def test_the_list_of_commands_is_complete() -> None:
    """COMMANDS (the examples test) names every command the tree has."""
    assert sorted(_all_commands()) == sorted(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) or "root" for c in COMMANDS])
def test_help_reads_as_written_by_a_person(command: list[str]) -> None:
    """No Python type names, no doubled brackets: a flag shows no value, a value a name."""
    text = invoke(*command, "--help").stdout
    for typer_label in ("<bool>", "<str>", "<int", "<list[", "<file>", "<path>", "[[", "{file}"):
        assert typer_label not in text, (typer_label, text)


@pytest.mark.parametrize(
    "args",
    [
        ["frobnicate"],
        ["sessions", "list", "--limit", "0"],
        ["sessions", "list", "--no-such-option"],
        ["sessions", "show"],
        ["copy"],
        ["import", "x.jsonl", "--if-exists", "merge"],
        ["sessions", "list", "--cursor", "not-a-cursor"],
        ["sessions", "list", "--metadata", "novalue"],
        ["sessions", "list", "--metadata", "n:=[1]"],
        ["--sessions-table", "bad-name", "sessions", "list"],
        ["--url", "oracle://u@h/db", "sessions", "list"],
        ["copy", "--to", "oracle://u@h/db"],
    ],
    ids=" ".join,
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    """Bad commands, options and option values are usage errors: exit code 2."""
    result = invoke(*args)
    assert result.exit_code == 2, result.output


def test_a_password_in_a_bad_url_is_masked() -> None:
    """The password of a URL never appears, even in a usage error about that URL."""
    result = invoke("--url", "oracle://app:hunter2@db/x", "sessions", "list")
    assert result.exit_code == 2
    assert "hunter2" not in result.output
    assert "***" in result.output


def test_unreachable_server_is_one_sentence_without_password(tmp_path: Path) -> None:
    """A connection failure is one line on stderr with the next step, exit 1, no traceback."""
    url = "postgresql://app:hunter2@127.0.0.1:9/db"
    result = invoke("--url", url, "sessions", "list")
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: cannot connect to 127.0.0.1:9")
    assert "Check that the server is running" in lines[0]
    assert "hunter2" not in result.output
    assert "Traceback" not in result.output


def test_debug_shows_the_traceback() -> None:
    """With --debug the real console script lets the traceback through (still exit 1)."""
    url = "postgresql://app:hunter2@127.0.0.1:9/db"
    plain = subprocess.run(  # noqa: S603 - fixed arguments
        [BIN, "--url", url, "sessions", "list"], capture_output=True, text=True, check=False
    )
    debug = subprocess.run(  # noqa: S603 - fixed arguments
        [BIN, "--debug", "--url", url, "sessions", "list"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (plain.returncode, debug.returncode) == (1, 1)
    assert "Traceback" not in plain.stderr
    assert "Traceback (most recent call last)" in debug.stderr


def test_missing_sqlite_file_is_not_created(tmp_path: Path) -> None:
    """Reading from a SQLite file that does not exist says how to create it, and creates nothing."""
    db = tmp_path / "nothing.db"
    result = invoke("--url", f"sqlite:///{db}", "sessions", "list")
    assert result.exit_code == 1
    assert "no database file" in result.stderr
    assert "agents-memory db upgrade --url" in result.stderr
    assert not db.exists()


def test_url_from_environment(tmp_path: Path) -> None:
    """Without --url, $AGENTS_MEMORY_URL names the database."""
    db = tmp_path / "env.db"
    env = {"AGENTS_MEMORY_URL": f"sqlite:///{db}"}
    result = CliRunner().invoke(app, ["db", "upgrade"], env=env)
    assert result.exit_code == 0, result.output
    assert str(db) in result.stdout
    assert db.exists()
