"""The options the README calls global work before or after the command name."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from agents_memory._cli import app
from agents_memory._cli._app import hoist_globals


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env={"AGENTS_MEMORY_URL": None})
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("place", ["before", "after"])
def test_url_and_tables_before_or_after_any_command(tmp_path: Path, place: str) -> None:
    """demo, db history, db upgrade and sessions list take --url/--sessions-table either way."""
    url = f"sqlite:///{tmp_path / 'g.db'}"
    store = ["--url", url, "--sessions-table", "gs", "--messages-table", "gm"]
    for command in (["db", "upgrade"], ["demo"], ["db", "history"], ["sessions", "list"]):
        args = [*store, *command] if place == "before" else [*command, *store]
        code, out, err = invoke(*args)
        assert code == 0, (args, out, err)
        assert "No such option" not in err
    code, _, err = invoke("sessions", "list", *store[:2])
    assert code == 1  # the demo went to gs/gm: the default tables were never made
    assert "gs/gm" in err  # ...and the error names the set that exists
    code, out, _ = invoke("sessions", "list", *store)
    assert "demo" in out


def test_debug_after_the_command_lets_the_traceback_through(tmp_path: Path) -> None:
    """--debug after the command name is accepted (and shows the traceback)."""
    bad = f"sqlite:///{tmp_path / 'missing' / 'x.db'}"
    result = CliRunner().invoke(app, ["sessions", "list", "--url", bad, "--debug"])
    assert result.exit_code != 0
    assert result.exception is not None
    assert not isinstance(result.exception, SystemExit)


def test_hoisting_keeps_order_and_stops_at_double_dash() -> None:
    """Later values still win; after `--` nothing is moved."""
    args = ["sessions", "show", "--url", "a", "x", "--url=b", "--", "--debug"]
    assert hoist_globals(args) == [
        "--url",
        "a",
        "--url=b",
        "sessions",
        "show",
        "x",
        "--",
        "--debug",
    ]
