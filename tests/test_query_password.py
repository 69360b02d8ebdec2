"""A password given as ``?password=…`` is masked everywhere ``user:pw@`` is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from agents_memory import DatabaseConnectionError, SchemaNotReadyError, SessionStore

SECRET = "hunter2-q"  # noqa: S105 - a made-up password the output must not show
BIN = Path(sys.executable).parent / "agents-memory"


async def test_repr_and_connection_error_hide_a_query_password() -> None:
    """repr() and DatabaseConnectionError of an unreachable server never show the password."""
    url = f"postgresql://app@127.0.0.1:9/x?password={SECRET}"
    store = SessionStore.from_url(url)
    try:
        assert SECRET not in repr(store)
        assert "password=***" in repr(store)
        with pytest.raises(DatabaseConnectionError) as info:
            await store.session("a").get_items()
        assert SECRET not in str(info.value)
    finally:
        await store.close()


async def test_schema_error_and_its_command_hide_a_query_password(file_backend, names) -> None:
    """SchemaNotReadyError (and the upgrade command it suggests) mask ``?password=``.

    Postgres here trusts local connections, so the password is accepted and unused;
    MariaDB's passwordless root refuses any password: its connection error is checked.
    """
    if file_backend.kind == "sqlite":
        pytest.skip("SQLite URLs carry no password")
    url = make_url(file_backend.url).update_query_dict({"password": SECRET})
    raw = url.render_as_string(hide_password=False)
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    async with SessionStore.from_url(raw, **kw) as store:
        expected = SchemaNotReadyError if file_backend.kind == "postgres" else Exception
        with pytest.raises(expected) as info:
            await store.session("a").get_items()
    message = str(info.value)
    assert SECRET not in message
    assert "password=***" in message
    if file_backend.kind == "postgres":
        assert "agents-memory db upgrade" in message
    else:
        assert isinstance(info.value, DatabaseConnectionError)


def test_cli_lines_hide_a_query_password(tmp_path: Path) -> None:
    """The CLI's failure lines (copy to an unreachable server) never print the password."""
    source = f"sqlite:///{tmp_path / 'src.db'}"
    subprocess.run([BIN, "--url", source, "db", "upgrade"], check=True, capture_output=True)  # noqa: S603
    result = subprocess.run(  # noqa: S603 - fixed argument list
        [BIN, "--url", source, "copy", "--to", f"postgresql://app@127.0.0.1:9/x?password={SECRET}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert SECRET not in result.stdout + result.stderr
    assert "error:" in result.stderr
