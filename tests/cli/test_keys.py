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

from agents_memory import Keyring, SessionStore, get_models, migrations
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
        before = [
            r[0]
            for r in await conn.execute(
                select(m.c.message_data).order_by(m.c.session_id, m.c.position)
            )
        ]
    await invoke(cli, "import", str(sealed), "--if-exists", "replace", env={})
    async with encrypted.engine.connect() as conn:
        after = [
            r[0]
            for r in await conn.execute(
                select(m.c.message_data).order_by(m.c.session_id, m.c.position)
            )
        ]
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


# -- import with keys: seal plaintext, check sealed items first, resume over sealed rows --------

KEY_C = Keyring.generate_key()


def _line(value: dict[str, Any]) -> str:
    return json.dumps(value, ensure_ascii=False) + "\n"


def _export_text(sessions: dict[str, list[dict[str, Any] | str]]) -> str:
    """An export: each session's header, then items (a ``str`` is a sealed envelope)."""
    out = []
    for sid, entries in sessions.items():
        out.append(
            _line(
                {
                    "session": sid,
                    "created_at": "2025-01-01T00:00:00",
                    "updated_at": "2025-01-01T01:00:00",
                    "metadata": None,
                }
            )
        )
        for n, entry in enumerate(entries):
            when = f"2025-01-01T00:00:{n:02d}"
            if isinstance(entry, str):
                out.append(_line({"sealed": entry, "created_at": when}))
            else:
                out.append(_line({"item": entry, "created_at": when}))
    return "".join(out)


async def _raw_rows(cli: Any) -> list[tuple[str, str]]:
    names = cli.names
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    async with SessionStore.from_url(cli.url, **kw) as store:
        m = get_models(names).Message.__table__
        async with store.engine.connect() as conn:
            query = select(m.c.session_id, m.c.message_data).order_by(m.c.session_id, m.c.position)
            return [(r[0], r[1]) for r in await conn.execute(query)]


async def test_import_with_keys_seals_plaintext_and_resumes_over_sealed_rows(
    cli: Any, tmp_path: Path
) -> None:
    from agents_memory._codec import encode_item  # noqa: PLC0415

    sealed_a = BOTH.encrypt(encode_item({"s": 0, "n": 2}))  # an item exported sealed, key a
    full = {
        "s0": [{"s": 0, "n": 0}, {"s": 0, "n": 1}, sealed_a, {"s": 0, "n": 3}],
        "s1": [{"s": 1, "n": n} for n in range(5)],
    }
    # An interrupted import left a prefix of each session: s0 ends on the sealed item,
    # s1 on a plaintext item the import sealed under b.
    partial = {"s0": full["s0"][:3], "s1": full["s1"][:2]}
    env = {**ENV, "AGENTS_MEMORY_KEY_CURRENT": "b"}
    first, whole = tmp_path / "partial.jsonl", tmp_path / "full.jsonl"
    first.write_text(_export_text(partial))
    whole.write_text(_export_text(full))
    await invoke(cli, "import", str(first), env=env)
    out = await invoke(cli, "import", str(whole), "--json", env=env)
    result = json.loads(out.stdout)
    assert result["items_written"] == 4
    assert result["items_present"] == 5
    rows = await _raw_rows(cli)
    assert len(rows) == 9  # nothing stored twice
    assert all(data.startswith("am1:") for _, data in rows)  # nothing plaintext at rest
    assert [data for _, data in rows].count(sealed_a) == 1  # the sealed item byte for byte
    assert sum(data.startswith("am1:b:") for _, data in rows) == 8
    names = cli.names
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    async with SessionStore.from_url(cli.url, encryption=BOTH, **kw) as store:
        assert await store.session("s0").get_items() == [{"s": 0, "n": n} for n in range(4)]
        assert await store.session("s1").get_items() == [{"s": 1, "n": n} for n in range(5)]
    # once more: everything is recognised, nothing written
    out = await invoke(cli, "import", str(whole), "--json", env=env)
    assert json.loads(out.stdout)["items_written"] == 0
    assert len(await _raw_rows(cli)) == 9
    # a keys file works the same way (and the key never shows up in the output)
    keys = tmp_path / "keys.txt"
    keys.write_text(f"a={KEY_A}\nb={KEY_B}\n")
    out = await invoke(cli, "import", str(whole), "--keys-file", str(keys), "--json", env={})
    assert json.loads(out.stdout)["items_present"] == 9


async def test_resuming_an_encrypted_import_without_keys_says_keys_are_needed(
    cli: Any, tmp_path: Path
) -> None:
    """Not a content conflict (whose advice, --if-exists replace, would overwrite good rows)."""
    full = {"s0": [{"s": 0, "n": n} for n in range(4)]}
    first, whole = tmp_path / "partial.jsonl", tmp_path / "full.jsonl"
    first.write_text(_export_text({"s0": full["s0"][:2]}))
    whole.write_text(_export_text(full))
    await invoke(cli, "import", str(first), env=ENV)  # sealed under b (current), cut after 2
    before = await _raw_rows(cli)
    assert len(before) == 2
    out = await invoke(cli, "import", str(whole), env={}, code=1)
    said = " ".join(out.stderr.split())
    assert "no keys" in said
    assert "keys rotate" in said
    assert "key id 'b'" in said
    assert "$AGENTS_MEMORY_KEYS" in said  # where the CLI reads them from
    assert "--if-exists replace" not in said
    assert await _raw_rows(cli) == before  # nothing written
    # keys lacking the one the rows were sealed with: that key is named
    only_a = {"AGENTS_MEMORY_KEYS": f"a={KEY_A}"}
    out = await invoke(cli, "import", str(whole), env=only_a, code=1)
    assert "key id 'b', which is not in the keyring" in " ".join(out.stderr.split())
    assert await _raw_rows(cli) == before
    # with them it finishes
    await invoke(cli, "import", str(whole), env=ENV)
    assert len(await _raw_rows(cli)) == 4


async def test_import_refuses_a_sealed_item_its_keys_cannot_open_before_writing(
    cli: Any, tmp_path: Path
) -> None:
    from agents_memory._codec import encode_item  # noqa: PLC0415

    names = cli.names
    kw = {"sessions_table": names.sessions, "messages_table": names.messages}
    await migrations.upgrade(cli.url, **kw)
    other = Keyring({"c": KEY_C, "a": Keyring.generate_key()}, current="c")
    file = tmp_path / "in.jsonl"
    cases = [
        (other.encrypt(encode_item({"n": 1})), "key id 'c', which is not in the keyring"),
        (other.with_current("a").encrypt(encode_item({"n": 1})), "is a different key"),
    ]
    for sealed, message in cases:
        # the bad item comes last, after a whole session that would have been written first
        text = _export_text({"first": [{"n": 0}] * 3, "second": [{"n": 0}, sealed]})
        file.write_text(text)
        out = await invoke(cli, "import", str(file), env=ENV, code=1)
        assert message in out.stderr
        assert "line 7" in out.stderr
        for form in key_forms(KEY_C):
            assert form not in out.stdout
            assert form not in out.stderr
        assert await _raw_rows(cli) == []
        async with SessionStore.from_url(cli.url, **kw) as store:
            assert (await store.list_sessions()).sessions == []
    # without keys the file is carried as it is (no key needed to move sealed rows)
    await invoke(cli, "import", str(file), env={})
    assert len(await _raw_rows(cli)) == 5
