"""The same scripts through every front end: plain alembic, an app's env.py, an installed wheel."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path
from typing import Any

import pytest

from agents_memory import SessionStore, TableNames, create_engine, migrations, normalize_url

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def kw(names: TableNames) -> dict[str, str]:
    return {"sessions_table": names.sessions, "messages_table": names.messages}


def run(*args: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(  # noqa: S603 - fixed argument lists
        [str(a) for a in args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"{args}\n{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


@pytest.mark.skipif(not (REPO / "alembic.ini").is_file(), reason="needs the source checkout")
async def test_plain_alembic_from_the_repo_root(file_backend: Any, names: TableNames) -> None:
    """`alembic upgrade head` with -x url/table names works from the root, async URLs included."""
    alembic = BIN / "alembic"
    x = ["-x", f"url={file_backend.url}", "-x", f"sessions_table={names.sessions}"]
    x += ["-x", f"messages_table={names.messages}"]
    run(alembic, *x, "upgrade", "head", cwd=REPO)
    assert migrations.head() in run(alembic, *x, "current", cwd=REPO)
    run(alembic, *x, "check", cwd=REPO)
    engine = create_engine(file_backend.url)
    try:
        assert await migrations.current(engine, **kw(names)) == migrations.head()
        await SessionStore(engine, **kw(names)).session("a").add_items([{"x": 1}])
        run(alembic, *x, "downgrade", "0001", cwd=REPO)
        assert await migrations.current(engine, **kw(names)) == "0001"
        # the environment variables are the fallback for -x
        env = {
            "AGENTS_MEMORY_URL": file_backend.url,
            "AGENTS_MEMORY_SESSIONS_TABLE": names.sessions,
            "AGENTS_MEMORY_MESSAGES_TABLE": names.messages,
        }
        run(alembic, "upgrade", "head", cwd=REPO, env=env)
        assert await migrations.current(engine, **kw(names)) == migrations.head()
        assert await SessionStore(engine, **kw(names)).session("a").get_items() == [{"x": 1}]
    finally:
        await engine.dispose()


APP_ENV = """
import asyncio
from alembic import context
from sqlalchemy.ext.asyncio import create_async_engine
from agents_memory.migrations import upgrade_connection

def do_run_migrations(connection):
    # agents_memory's lineage first: its own version table, its own tables.
    upgrade_connection(connection, sessions_table={s!r}, messages_table={m!r})
    context.configure(connection=connection, version_table={v!r})
    with context.begin_transaction():
        context.run_migrations()

async def main():
    x = context.get_x_argument(as_dictionary=True)
    options = {{}}
    if x.get("pooler"):  # SQLAlchemy's documented asyncpg settings behind a transaction pooler
        import uuid
        options["connect_args"] = {{
            "statement_cache_size": 0,
            "prepared_statement_cache_size": 0,
            "prepared_statement_name_func": lambda: f"__asyncpg_{{uuid.uuid4().hex}}__",
        }}
    engine = create_async_engine(x["url"], **options)
    async with engine.connect() as connection:
        await connection.run_sync(do_run_migrations)
        await connection.commit()
    await engine.dispose()

asyncio.run(main())
"""

APP_REVISION = """
from alembic import op
import sqlalchemy as sa

revision = "app1"
down_revision = None

def upgrade():
    op.create_table({t!r}, sa.Column("id", sa.Integer, primary_key=True))

def downgrade():
    op.drop_table({t!r})
"""


async def test_recipe_app_alembic_env_includes_ours(
    file_backend: Any, names: TableNames, tmp_path: Path
) -> None:
    """An application's own env.py runs our lineage beside its own; each keeps its version table."""
    app = tmp_path / "app"
    (app / "versions").mkdir(parents=True)
    app_table, app_version = f"{names.sessions}_app", f"{names.sessions}_appver"
    (app / "env.py").write_text(
        textwrap.dedent(APP_ENV.format(s=names.sessions, m=names.messages, v=app_version))
    )
    (app / "versions" / "app1.py").write_text(textwrap.dedent(APP_REVISION.format(t=app_table)))
    (tmp_path / "alembic.ini").write_text(f"[alembic]\nscript_location = {app}\n")
    url = str(normalize_url(file_backend.url).render_as_string(hide_password=False))
    # The application's own engine behind PgBouncer needs its own pooler settings (ours
    # come with the URL): without them asyncpg's cached statement names collide there.
    pooler = ["-x", "pooler=1"] if file_backend.id == "pgbouncer" else []
    run(BIN / "alembic", "-x", f"url={url}", *pooler, "upgrade", "head", cwd=tmp_path)
    engine = create_engine(file_backend.url)
    try:
        assert await migrations.current(engine, **kw(names)) == migrations.head()
        assert await migrations.check(engine, **kw(names)) == []
        await SessionStore(engine, **kw(names)).session("a").add_items([{"x": 1}])
        from sqlalchemy import text  # noqa: PLC0415

        async with engine.connect() as conn:
            app_rev = (await conn.execute(text(f"SELECT version_num FROM {app_version}"))).scalar()
            assert app_rev == "app1"
            await conn.execute(text(f"SELECT count(*) FROM {app_table}"))
    finally:
        async with engine.begin() as conn:
            for t in (app_table, app_version):
                await conn.execute(text(f"DROP TABLE IF EXISTS {t}"))
        await engine.dispose()


@pytest.mark.skipif(not (REPO / "pyproject.toml").is_file(), reason="needs the source checkout")
def test_wheel_ships_and_runs_the_migrations(tmp_path: Path) -> None:
    """A built wheel, installed in a fresh venv, migrates a database using its bundled scripts."""
    dist = tmp_path / "dist"
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, REPO, cwd=tmp_path)
    (wheel,) = dist.glob("agents_memory-*.whl")
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    py = venv / "bin" / "python"
    site = Path(
        run(
            py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp_path
        ).strip()
    )
    run(
        sys.executable,
        "-m",
        "pip",
        "--python",
        py,
        "install",
        "--no-deps",
        "-q",
        wheel,
        cwd=tmp_path,
    )
    # Dependencies come from this environment, appended *after* the venv's own packages,
    # so the wheel's copy of agents_memory is the one imported.
    (site / "_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    db = tmp_path / "pip-user.db"
    script = textwrap.dedent(
        f"""
        import asyncio, agents_memory
        from agents_memory import migrations, SessionStore
        from agents_memory._migrations._scripts import script_location
        print(agents_memory.__file__)
        print(script_location())
        async def main():
            await migrations.upgrade("sqlite:///{db}")
            async with SessionStore.from_url("sqlite:///{db}") as store:
                await store.session("s").add_items([{{"ok": True}}])
                print(await store.session("s").get_items())
            print(await migrations.current("sqlite:///{db}"), await migrations.check("sqlite:///{db}"))
        asyncio.run(main())
        """
    )
    # (an empty PYTHONPATH: a source checkout on it would shadow the wheel under test)
    out = run(py, "-c", script, cwd=tmp_path, env={"PYTHONPATH": ""}).splitlines()
    assert out[0].startswith(str(site))
    assert out[1] == str(site / "agents_memory" / "_alembic")
    assert out[2] == "[{'ok': True}]"
    assert out[3] == f"{migrations.head()} []"
    assert (site / "agents_memory" / "py.typed").is_file()
    assert (venv / "bin" / "agents-memory").is_file()


@pytest.mark.skipif(not (REPO / "alembic.ini").is_file(), reason="needs the source checkout")
def test_plain_alembic_refuses_unknown_x_keys_and_logs_what_it_did(tmp_path: Path) -> None:
    """`-x ur=…` (a typo) fails listing the accepted keys; a success names the database."""
    ini = str(REPO / "alembic.ini")
    cmd = [sys.executable, "-m", "alembic", "-c", ini]
    typo = subprocess.run(  # noqa: S603 - fixed argument list
        [*cmd, "-x", f"ur=sqlite:///{tmp_path / 'a.db'}", "upgrade", "head"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert typo.returncode != 0
    assert "unknown -x argument ur" in typo.stderr
    assert "-x url=…, -x sessions_table=…, -x messages_table=…" in typo.stderr
    assert not (tmp_path / "agents_memory.db").exists()  # the default was not migrated
    assert not (tmp_path / "a.db").exists()
    url = f"sqlite:///{tmp_path / 'a.db'}"
    out = run(
        sys.executable,
        "-m",
        "alembic",
        "-c",
        ini,
        "-x",
        f"url={url}",
        "upgrade",
        "head",
        cwd=tmp_path,
    )
    assert (
        f"agents_memory tables agent_sessions/agent_messages in {url}: none -> {migrations.head()}"
        in out
    )
    assert "Running upgrade 0001 -> 0002" in out
    again = run(
        sys.executable,
        "-m",
        "alembic",
        "-c",
        ini,
        "-x",
        f"url={url}",
        "upgrade",
        "head",
        cwd=tmp_path,
    )
    assert f"in {url}: at {migrations.head()}" in again
