"""The suite's own promise: a missing Postgres skips with a reason, and fails under CI."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agents_memory import SessionStore

TESTS = Path(__file__).resolve().parent


def run_one_postgres_test(ci: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env |= {
        "AGENTS_MEMORY_TEST_DB": "postgres",
        "AGENTS_MEMORY_TEST_POSTGRES_URL": "postgresql://root@127.0.0.1:1/test",
    }
    if ci:
        env["CI"] = "true"
    target = f"{TESTS / 'sqlalchemy_store' / 'test_session.py'}::test_iter_items_streams_in_batches"
    return subprocess.run(  # noqa: S603 - fixed argument list
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", target],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


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
