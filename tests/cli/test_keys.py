"""``agents-memory keys rotate``, and export/copy/import/show of an encrypted store."""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select
from typer.testing import CliRunner, Result

from agents_memory import Keyring, SessionStore, get_models
from agents_memory._cli import app

KEY_A = Keyring.generate_key()
KEY_B = Keyring.generate_key()
BOTH = Keyring({"a": KEY_A, "b": KEY_B}, current="a")


def key_forms(key: str) -> set[str]:
    raw = base64.urlsafe_b64decode(key)
    return {key, key.rstrip("="), base64.b64encode(raw).decode(), raw.hex()}


async def invoke(cli: Any, *args: str, env: dict[str, str | None], code: int = 0) -> Result:
    runner = CliRunner()
    full_env: dict[str, str | None] = {
        "AGENTS_MEMORY_URL": None,
        "AGENTS_MEMORY_KEYS": None,
        "AGENTS_MEMORY_KEYS_FILE": None,
        "AGENTS_MEMORY_KEY_CURRENT": None,
        "COLUMNS": "200",
        **env,
    }
    result = await asyncio.to_thread(
        runner.invoke, app, [*cli.store_args, *args], env=full_env, catch_exceptions=False
    )
    assert result.exit_code == code, (result.stdout, result.stderr)
    for key in (KEY_A, KEY_B):
        for form in key_forms(key):
            assert form not in result.stdout
            assert form not in result.stderr
    return result


@pytest.fixture
async def encrypted(cli: Any) -> SessionStore:
    """The CLI's store with 3 sessions: plaintext items, then items under key a."""
    names = cli.names
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    async with SessionStore.from_url(cli.url, create_tables=True, **kw) as plain:
        for s in range(3):
            await plain.session(f"s{s}").add_items([{"s": s, "n": n} for n in range(4)])
    store = SessionStore.from_url(cli.url, encryption=BOTH, **kw)
    for s in range(3):
        await store.session(f"s{s}").add_items([{"s": s, "n": n} for n in range(4, 10)])
    return store


ENV = {"AGENTS_MEMORY_KEYS": f"a={KEY_A},b={KEY_B}"}


async def test_rotate_dry_run_then_rotate_from_the_environment(
    cli: Any, encrypted: SessionStore
) -> None:
    out = await invoke(cli, "keys", "rotate", "--to", "b", "--dry-run", "--json", env=ENV)
    assert json.loads(out.stdout)["remaining"] == 30
    out = await invoke(cli, "keys", "rotate", "--to", "b", "--batch-size", "4", env=ENV)
    assert "re-encrypted 30 items under key 'b'" in out.stdout
    out = await invoke(cli, "keys", "rotate", "--to", "b", "--dry-run", env=ENV)
    assert out.stdout.startswith("0 items")
    only_b = Keyring({"b": KEY_B}, current="b")
    names = cli.names
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    async with SessionStore.from_url(cli.url, encryption=only_b, **kw) as s:
        assert await s.session("s2").get_items() == [{"s": 2, "n": n} for n in range(10)]
    await encrypted.close()


async def test_keys_file_and_bad_sources(cli: Any, encrypted: SessionStore, tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text(f"# the store's keys\na={KEY_A}\n\nb={KEY_B}\n")
    await invoke(cli, "keys", "rotate", "--to", "b", "--keys-file", str(keys), env={})
    out = await invoke(cli, "keys", "rotate", "--to", "b", env={}, code=1)
    assert "no encryption keys given" in out.stderr
    assert "AGENTS_MEMORY_KEYS" in out.stderr
    out = await invoke(cli, "keys", "rotate", "--to", "b", env={"AGENTS_MEMORY_KEYS": "a"}, code=1)
    assert "entry 1 is not id=key" in out.stderr
    bad = {"AGENTS_MEMORY_KEYS": f"a={KEY_A[:20]}"}
    out = await invoke(cli, "keys", "rotate", "--to", "a", env=bad, code=1)
    assert "'a' must be 32 random bytes" in out.stderr
    assert KEY_A[:20] not in out.stderr
    # the store's rows are under b now; a keyring with only a cannot read them
    only_a = {"AGENTS_MEMORY_KEYS": f"a={KEY_A}"}
    out = await invoke(cli, "keys", "rotate", "--to", "a", env=only_a, code=1)
    assert "key id 'b'" in out.stderr
    assert "--keys-file" in out.stderr
    await encrypted.close()


async def test_show_reads_encrypted_items_with_keys_and_refuses_without(
    cli: Any, encrypted: SessionStore
) -> None:
    out = await invoke(cli, "sessions", "show", "s1", "--json", env=ENV)
    assert json.loads(out.stdout) == [{"s": 1, "n": n} for n in range(10)]
    out = await invoke(cli, "sessions", "show", "s1", env={}, code=1)
    assert "encrypted (key id 'a')" in out.stderr
    await encrypted.close()


async def test_export_carries_sealed_items_and_decrypts_on_request(
    cli: Any, encrypted: SessionStore, tmp_path: Path
) -> None:
    sealed = tmp_path / "sealed.jsonl"
    await invoke(cli, "export", "-o", str(sealed), env={})  # no key needed
    lines = [json.loads(x) for x in sealed.read_text().splitlines()]
    assert sum("sealed" in x for x in lines) == 18
    assert sum("item" in x for x in lines) == 12
    assert all(x["sealed"].startswith("am1:a:") for x in lines if "sealed" in x)
    plain = tmp_path / "plain.jsonl"
    await invoke(cli, "export", "--decrypt", "-o", str(plain), env=ENV)
    items = [json.loads(x) for x in plain.read_text().splitlines()]
    assert sum("item" in x for x in items) == 30
    assert not any("sealed" in x for x in items)
    await invoke(cli, "export", "--decrypt", "-o", str(plain), env={}, code=1)
    # a sealed export imports back unchanged: byte-identical rows
    m = get_models(cli.names).Message.__table__
    async with encrypted.engine.connect() as conn:
        before = [r[0] for r in await conn.execute(select(m.c.message_data).order_by(m.c.id))]
    await invoke(cli, "import", str(sealed), "--if-exists", "replace", env={})
    async with encrypted.engine.connect() as conn:
        after = [r[0] for r in await conn.execute(select(m.c.message_data).order_by(m.c.id))]
    assert sorted(after) == sorted(before)
    assert await encrypted.session("s0").get_items() == [{"s": 0, "n": n} for n in range(10)]
    await encrypted.close()


async def test_copy_carries_ciphertext_without_a_key(
    cli: Any, encrypted: SessionStore, tmp_path: Path
) -> None:
    dest = f"sqlite+aiosqlite:///{tmp_path / 'dest.db'}"
    await invoke(cli, "copy", "--to", dest, env={})
    names = cli.names
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    async with SessionStore.from_url(dest, encryption=BOTH, **kw) as copied:
        assert await copied.session("s1").get_items() == [{"s": 1, "n": n} for n in range(10)]
        m = get_models(names).Message.__table__
        async with copied.engine.connect() as conn:
            rows = [r[0] for r in await conn.execute(select(m.c.message_data))]
    assert sum(r.startswith("am1:a:") for r in rows) == 18
    # run again: resume recognises the sealed items, nothing is duplicated
    await invoke(cli, "copy", "--to", dest, env={})
    async with SessionStore.from_url(dest, encryption=BOTH, **kw) as copied:
        assert len(await copied.session("s1").get_items()) == 10
    await encrypted.close()


async def test_delete_refuses_without_keys_and_forces_on_request(
    cli: Any, encrypted: SessionStore
) -> None:
    out = await invoke(cli, "sessions", "delete", "s1", "--yes", env={}, code=1)
    assert "encrypted (key id 'a')" in out.stderr
    assert "--force" in out.stderr
    assert len(await encrypted.session("s1").get_items()) == 10
    await invoke(cli, "sessions", "delete", "s1", "--yes", env=ENV)  # keys given: checked, deleted
    assert await encrypted.get_session("s1") is None
    await invoke(cli, "sessions", "delete", "s2", "--yes", "--force", env={})
    assert await encrypted.get_session("s2") is None
    await encrypted.close()
