"""The suite's own promise: a missing Postgres skips with a reason, and fails under CI."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agents_memory import SessionStore

TESTS = Path(__file__).resolve().parent


def run_pytest(
    *args: str, env: dict[str, str], ci: bool = False
) -> subprocess.CompletedProcess[str]:
    """Run pytest in a fresh interpreter, ``env`` over this one's (``CI`` only when asked)."""
    full = {k: v for k, v in os.environ.items() if k != "CI"} | env
    if ci:
        full["CI"] = "true"
    return subprocess.run(  # noqa: S603 - a fixed interpreter and argument list
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *args],
        capture_output=True,
        text=True,
        env=full,
        timeout=120,
        check=False,
    )


def run_one_postgres_test(ci: bool) -> subprocess.CompletedProcess[str]:
    target = f"{TESTS / 'sqlalchemy_store' / 'test_session.py'}::test_iter_items_streams_in_batches"
    env = {
        "AGENTS_MEMORY_TEST_DB": "postgres",
        "AGENTS_MEMORY_TEST_POSTGRES_URL": "postgresql://root@127.0.0.1:1/test",
    }
    return run_pytest(target, env=env, ci=ci)


def test_unreachable_postgres_is_skipped_with_the_reason() -> None:
    """Without CI, an unreachable server skips its tests and says where it looked."""
    result = run_one_postgres_test(ci=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout
    assert "no postgres server answers at 127.0.0.1:1" in result.stdout.lower()


def test_unreachable_postgres_fails_under_ci() -> None:
    """With CI set, the same situation is a failure, so CI cannot pass by skipping."""
    result = run_one_postgres_test(ci=True)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "CI is set" in result.stdout


PROBE = """
import socket

import pytest


@pytest.fixture
def connects_when_done():
    yield
    socket.create_connection(("127.0.0.1", {server_port}), timeout=5).close()


def test_connects_to_a_server_without_backend():
    socket.create_connection(("127.0.0.1", {server_port}), timeout=5).close()


def test_connects_in_teardown(connects_when_done):
    pass


def test_connects_to_something_else():
    socket.create_connection(("127.0.0.1", {other_port}), timeout=5).close()


def test_runs_on_each_database(backend):
    assert backend.kind
"""


def test_tests_without_a_database_run_once_and_reach_no_server(tmp_path: Path) -> None:
    """A test without ``backend`` runs once and never talks to a server.

    It runs when sqlite is selected, is deselected from a server-only selection, and fails
    if it (or its fixtures' teardown) connects to a configured server's port. The suite's
    own conftest and pytest settings run over a probe file in a fresh interpreter, with two
    listening sockets: one where the Postgres URL points, one elsewhere.
    """
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        socket.create_server(("127.0.0.1", 0)) as other,
    ):
        server_port, other_port = server.getsockname()[1], other.getsockname()[1]
        probe = tmp_path / "test_probe.py"
        probe.write_text(PROBE.format(server_port=server_port, other_port=other_port))
        settings = ("-c", str(TESTS.parent / "pyproject.toml"), "--rootdir", str(tmp_path))
        probe_args = (*settings, "-p", "conftest", str(probe))
        path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p)
        with_sqlite = run_pytest(
            *probe_args,
            env={
                "PYTHONPATH": path,
                "AGENTS_MEMORY_TEST_DB": "sqlite",
                "AGENTS_MEMORY_TEST_POSTGRES_URL": f"postgresql://root@127.0.0.1:{server_port}/test",
            },
        )
    out = with_sqlite.stdout + with_sqlite.stderr
    assert "1 failed, 4 passed, 1 error" in with_sqlite.stdout, out
    assert "test_connects_to_a_server_without_backend takes no `backend` fixture" in out, out
    assert "ERROR at teardown of test_connects_in_teardown" in out, out
    assert "(postgres)" in out, out

    servers_only = run_pytest(  # Postgres at port 1: nothing answers, its test skips
        *probe_args,
        env={
            "PYTHONPATH": path,
            "AGENTS_MEMORY_TEST_DB": "postgres",
            "AGENTS_MEMORY_TEST_POSTGRES_URL": "postgresql://root@127.0.0.1:1/test",
        },
    )
    out = servers_only.stdout + servers_only.stderr
    assert "1 skipped, 3 deselected" in servers_only.stdout, out


async def test_password_never_shown() -> None:
    """A password in the URL appears in no repr and no connection error."""
    store = SessionStore.from_url("postgresql://bob:s3cr3t-pw@127.0.0.1:1/db")
    try:
        assert "s3cr3t-pw" not in repr(store)
        assert "s3cr3t-pw" not in repr(store.session("a"))
        with pytest.raises(Exception) as info:  # noqa: PT011 - any driver error will do
            await store.session("a").get_items()
        text = "".join(str(e) for e in (info.value, info.value.__cause__, info.value.__context__))
        assert "s3cr3t-pw" not in text
    finally:
        await store.close()


@pytest.mark.parametrize(
    ("url", "driver", "extra"),
    [("postgresql://u@h/db", "asyncpg", "postgres"), ("mysql://u@h/db", "asyncmy", "mysql")],
)
def test_a_missing_driver_names_its_extra(url: str, driver: str, extra: str) -> None:
    """Without the server driver installed, the URL's error says which extra to install.

    Run in a fresh interpreter where the driver cannot be imported; SQLite still works there.
    """
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules[{driver!r}] = None  # as if it were not installed
        from agents_memory import create_engine
        create_engine("sqlite://")
        try:
            create_engine({url!r})
        except ModuleNotFoundError as exc:
            print(exc.name, "|", exc)
        """
    )
    out = subprocess.run(  # noqa: S603 - a fixed interpreter and script
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert out.startswith(f"{driver} |"), out
    assert f"pip install 'agents-memory[{extra}]'" in out
