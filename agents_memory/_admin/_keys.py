"""Where the CLI gets encryption keys: environment variables or a file, never the command line.

* ``AGENTS_MEMORY_KEYS``: ``id=key,id=key`` (keys url-safe base64, as
  ``Keyring.generate_key()`` or ``Fernet.generate_key()`` print them);
* ``AGENTS_MEMORY_KEYS_FILE`` or ``--keys-file PATH``: one ``id=key`` per line,
  ``#`` comments and blank lines ignored (keep it ``chmod 600``);
* ``AGENTS_MEMORY_KEY_CURRENT``: the id new items are written under (default:
  the last key listed).

A file given on the command line wins over ``AGENTS_MEMORY_KEYS_FILE``, which
wins over ``AGENTS_MEMORY_KEYS``. Errors name the variable or the file and line,
never a key.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from agents_memory._crypto import Keyring

KEYS_ENV = "AGENTS_MEMORY_KEYS"
KEYS_FILE_ENV = "AGENTS_MEMORY_KEYS_FILE"
CURRENT_ENV = "AGENTS_MEMORY_KEY_CURRENT"


class KeySourceError(ValueError):
    """The keys could not be read from their source (the message names it, never a key)."""


def _pairs(entries: list[tuple[str, str]], source: str) -> dict[str, str]:
    keys: dict[str, str] = {}
    for where, entry in entries:
        key_id, eq, key = entry.partition("=")
        key_id, key = key_id.strip(), key.strip()
        if not eq or not key_id or not key:
            msg = f"{source}: {where} is not id=key"
            raise KeySourceError(msg)
        if key_id in keys:
            msg = f"{source}: key id {key_id!r} is given twice"
            raise KeySourceError(msg)
        keys[key_id] = key
    return keys


def load_keyring(
    keys_file: Path | None = None, environ: Mapping[str, str] | None = None
) -> Keyring | None:
    """The keyring the environment (or ``keys_file``) describes; ``None`` when none is set."""
    env = os.environ if environ is None else environ
    path = keys_file or (Path(env[KEYS_FILE_ENV]) if env.get(KEYS_FILE_ENV) else None)
    if path is not None:
        source = f"keys file {str(path)!r}"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            msg = f"cannot read {source}: {exc.strerror or type(exc).__name__}"
            raise KeySourceError(msg) from None
        entries = [
            (f"line {n}", line.strip())
            for n, line in enumerate(text.splitlines(), 1)
            if line.strip() and not line.strip().startswith("#")
        ]
    elif env.get(KEYS_ENV):
        source = f"${KEYS_ENV}"
        parts = [p.strip() for p in env[KEYS_ENV].split(",")]
        entries = [(f"entry {n}", p) for n, p in enumerate(parts, 1) if p]
    else:
        return None
    keys = _pairs(entries, source)
    if not keys:
        msg = f"{source} holds no keys"
        raise KeySourceError(msg)
    current = env.get(CURRENT_ENV) or list(keys)[-1]
    try:
        return Keyring(keys, current=current)
    except (TypeError, ValueError) as exc:
        msg = f"{source}: {exc}"
        raise KeySourceError(msg) from None


def require_keyring(keys_file: Path | None = None) -> Keyring:
    """:func:`load_keyring`, or an error saying where keys are looked for."""
    keyring = load_keyring(keys_file)
    if keyring is None:
        msg = (
            f"no encryption keys given: set ${KEYS_ENV} (id=key,...) or ${KEYS_FILE_ENV}, "
            "or pass --keys-file PATH (one id=key per line)"
        )
        raise KeySourceError(msg)
    return keyring
