"""The README's recipe in an application made by ``alembic init -t async``, run by the real CLI.

Each server test gets a database of its own: the application's autogenerate and
``alembic check`` compare everything in the database, so a shared one would show
other tests' tables.
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from agents_memory import SessionStore, create_engine, migrations, normalize_url

REPO = Path(__file__).resolve().parents[2]
ALEMBIC = Path(sys.executable).parent / "alembic"

APP_MODELS = """
from sqlalchemy import Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Note(Base):
    __tablename__ = "app_notes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    body: Mapped[str] = mapped_column(String(200))
"""


def alembic(*args: str, cwd: Path, ok: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(  # noqa: S603 - fixed argument lists
        [str(ALEMBIC), *args],
        cwd=cwd,
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if ok:
        assert result.returncode == 0, f"{args}\n{result.stdout}\n{result.stderr}"
    return result


def readme_recipe() -> str:
    """The README's recipe block, exactly as written."""
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("Recipe — our lineage inside") :]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None
    return match.group(1)


def apply_recipe(env_py: str, recipe: str) -> str:
    """The recipe's import after the template's; its functions replace the template's."""
    recipe_tree = ast.parse(recipe)
    recipe_lines = recipe.splitlines()
    imports = [
        "\n".join(recipe_lines[n.lineno - 1 : n.end_lineno])
        for n in recipe_tree.body
        if isinstance(n, ast.ImportFrom | ast.Import)
    ]
    functions = {
        n.name: "\n".join(recipe_lines[n.lineno - 1 : n.end_lineno])
        for n in recipe_tree.body
        if isinstance(n, ast.FunctionDef)
    }
    assert set(functions) == {"run_migrations_offline", "do_run_migrations"}
    lines = env_py.splitlines()
    # replace from the bottom up so earlier line numbers stay valid
    template_functions = sorted(
        (n for n in ast.parse(env_py).body if isinstance(n, ast.FunctionDef)),
        key=lambda n: n.lineno,
        reverse=True,
    )
    for node in template_functions:
        if node.name in functions:
            assert node.end_lineno is not None
            lines[node.lineno - 1 : node.end_lineno] = functions.pop(node.name).splitlines()
    assert not functions, f"the template has no {sorted(functions)}"
    out = "\n".join(lines) + "\n"
    out = out.replace(
        "from alembic import context\n", "from alembic import context\n" + "\n".join(imports) + "\n"
    )
    return out.replace(
        "target_metadata = None\n",
        "from app_models import Base\n\ntarget_metadata = Base.metadata\n",
    )


@contextlib.asynccontextmanager
async def own_database(backend: Any) -> AsyncIterator[str]:
    """A URL to a database made for this test (a file for SQLite), dropped afterwards."""
    if backend.kind == "sqlite":
        yield str(backend.url)
        return
    name = f"am_host_{uuid.uuid4().hex[:10]}"
    admin = create_engine(backend.url, isolation_level="AUTOCOMMIT")
    quoted = admin.dialect.identifier_preparer.quote(name)
    try:
        async with admin.connect() as conn:
            await conn.execute(text(f"CREATE DATABASE {quoted}"))
        try:
            yield make_url(backend.url).set(database=name).render_as_string(hide_password=False)
        finally:
            async with admin.connect() as conn:
                await conn.execute(text(f"DROP DATABASE IF EXISTS {quoted}"))
    finally:
        await admin.dispose()


@pytest.mark.direct_postgres("it creates a database of its own, which the pooler does not list")
async def test_readme_recipe_in_an_alembic_init_async_app(
    file_backend: Any,
    tmp_path: Path,
) -> None:
    """Autogenerate proposes nothing of ours; check/autogenerate change nothing; rows kept."""
    async with own_database(file_backend) as url:
        async_url = normalize_url(url).render_as_string(hide_password=False)
        alembic("init", "-t", "async", "app", cwd=tmp_path)
        env_py = tmp_path / "app" / "env.py"
        env_py.write_text(apply_recipe(env_py.read_text(), readme_recipe()))
        (tmp_path / "app_models.py").write_text(APP_MODELS)
        ini = tmp_path / "alembic.ini"
        ini.write_text(
            ini.read_text().replace(
                "sqlalchemy.url = driver://user:pass@localhost/dbname",
                f"sqlalchemy.url = {async_url.replace('%', '%%')}",
            )
        )

        # first upgrade: the app has no revision yet; ours are created
        alembic("upgrade", "head", cwd=tmp_path)
        engine = create_engine(url)
        try:
            assert await migrations.current(engine) == migrations.head()
            store = SessionStore(engine)
            await store.session("kept").add_items([{"role": "user", "content": "hi"}])

            # a comparing command never migrates ours: step ours back, compare, look again
            await migrations.downgrade(engine, revision="0001")
            out = alembic("revision", "--autogenerate", "-m", "notes", cwd=tmp_path)
            assert await migrations.current(engine) == "0001"
            [revision_file] = (tmp_path / "app" / "versions").glob("*.py")
            script = revision_file.read_text()
            assert "app_notes" in script, out.stderr
            for ours in ("agent_sessions", "agent_messages", "agent_sessions_version"):
                assert ours not in script, script

            alembic("upgrade", "head", cwd=tmp_path)
            assert await migrations.current(engine) == migrations.head()
            assert await store.session("kept").get_items() == [{"role": "user", "content": "hi"}]

            await migrations.downgrade(engine, revision="0001")
            alembic("check", cwd=tmp_path)
            assert await migrations.current(engine) == "0001"
            alembic("upgrade", "head", cwd=tmp_path)
            assert await migrations.check(engine) == []

            offline = alembic("upgrade", "head", "--sql", cwd=tmp_path)
            assert "agent_sessions/agent_messages are NOT in this script" in offline.stdout
            assert "agents-memory db upgrade" in offline.stdout
            assert "CREATE TABLE app_notes" in offline.stdout
            await store.close()
        finally:
            await engine.dispose()  # before its database is dropped
