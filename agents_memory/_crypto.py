"""Encryption at rest: the :class:`Keyring` and the envelope a stored item is sealed in.

An encrypted row's ``message_data`` is text (the existing column: no schema change)::

    am1:<key id>:<key check>:<base64(nonce || AES-GCM ciphertext and tag)>

* ``am1`` names the format; JSON items always start with ``{``, so a row is an
  envelope exactly when it starts with ``am`` followed by a digit and a colon
  (``ENVELOPE_MARK``), and plaintext and encrypted rows can live side by side.
* the key id says which key of the keyring opens it;
* the key check is 6 bytes of ``HMAC-SHA256(key, "agents_memory key check")``: a
  keyring holding the id but *another* key is told apart before anything is
  decrypted or deleted (a wrong key is never mistaken for a corrupt row);
* the body is standard base64 (1.33x the ciphertext). Hex decodes about four
  times faster in CPython, but doubles the row: on Postgres an ~840-byte item then
  crosses the TOAST threshold, and end to end (``benchmarks/encryption.py``) the
  two were within the machine's noise, so the smaller rows won;
* the header (``am1:<id>:<check>``) is the AES-GCM associated data. The session id
  is deliberately **not** bound: ``fork`` and ``copy`` carry rows to other
  session ids, and must not need a key to do it. Whoever can rewrite rows can
  also delete them; what encryption at rest protects is what the rows say.

Keys are 32 random bytes (AES-256), given raw or url-safe base64 as
``cryptography.fernet.Fernet.generate_key()`` makes them. No message, ``repr`` or
log line ever holds key material: errors name the key id only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import re
import threading
from binascii import a2b_base64, b2a_base64
from collections.abc import Mapping
from typing import Any

from agents_memory._errors import DecryptionError, MissingKeyError

FORMAT = "am1"
"""The envelope format this version writes (and the only one it reads)."""
ENVELOPE_MARK = "am"
"""What every envelope starts with; a JSON object never does."""
_ENVELOPE = re.compile(r"am\d+:")
_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_CHECK_INFO = b"agents_memory key check"
_NONCE_BYTES = 12
KEY_BYTES = 32
CACHE_MAX_ENVELOPE = 16 * 1024
"""Envelopes longer than this (characters) are opened every time, never cached."""


_TAIL = 24
"""Characters of an envelope's end the cache indexes by: its AES-GCM tag (random-looking)."""


class _OpenedCache:
    """A bounded cache of envelope text -> the plaintext it authenticated to.

    Indexed by the envelope's last characters (its authentication tag), so a lookup
    hashes 24 characters instead of a whole ~1 KB row, and a hit then compares the
    *entire* stored text with the envelope that authenticated: only the exact same
    text is ever answered from the cache. Two envelopes sharing a tail (practically
    never) just evict each other.

    Eviction is oldest-inserted first, with a second chance: a hit on an entry that
    has fallen into the older half (``stale`` or more insertions ago) re-inserts it
    at the young end. So an envelope read at least once every ``size // 2`` new
    envelopes is never evicted (what an agent re-reading its latest items does), and
    a hit on a young entry touches nothing at all.

    Who calls it: a ``SessionStore`` / ``SQLAlchemySession`` decrypts on the event loop,
    each ``SQLiteSession`` on its own worker thread, and one keyring may serve all of
    them at once. **Hits take no lock**: one ``dict.get`` (atomic on CPython with the GIL
    for ``str`` keys, whose hashing and comparison run no Python code and never release
    it; thread-safe by design on free-threaded builds, PEP 703), then a compare of
    an immutable tuple it returned. ``entries`` only ever holds tuples stored by
    :meth:`put` after the envelope authenticated, so whatever the interleaving, a hit
    answers an authenticated envelope's own plaintext. Every mutation (insert, the
    second-chance move, eviction) happens under ``lock``, so writers never interleave;
    a reader racing a writer sees the entry before or after, never half of it. The
    unlocked read of ``seq`` only decides whether to refresh, so a stale value costs
    at most one needless or one skipped refresh. The lock is never held while
    decrypting, so a slow open never blocks another thread.
    """

    __slots__ = ("entries", "lock", "seq", "size", "stale")

    def __init__(self, size: int) -> None:
        self.entries: dict[str, tuple[str, str, int]] = {}
        self.lock = threading.Lock()
        self.size = size
        self.stale = max(1, size // 2)
        self.seq = 0

    def put(self, envelope: str, plain: str) -> None:
        """Insert (or move to the young end) an envelope that authenticated to ``plain``."""
        tail = envelope[-_TAIL:]
        entries = self.entries
        with self.lock:
            self.seq = seq = self.seq + 1
            entries.pop(tail, None)  # re-inserting moves it to the end of the dict's order
            entries[tail] = (envelope, plain, seq)
            if len(entries) > self.size:
                del entries[next(iter(entries))]  # the oldest insertion

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, envelope: object) -> bool:
        if not isinstance(envelope, str):
            return False
        entry = self.entries.get(envelope[-_TAIL:])
        return entry is not None and entry[0] == envelope


def _aesgcm() -> Any:  # noqa: ANN401 - cryptography's class, imported on first use
    """AES-GCM from ``cryptography``, or an error naming the extra that installs it."""
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: PLC0415
    except ModuleNotFoundError as exc:
        msg = (
            "encryption needs the cryptography package, which is not installed: "
            "pip install 'agents-memory[encryption]'"
        )
        raise ModuleNotFoundError(msg, name="cryptography") from exc
    return AESGCM


def _key_bytes(key_id: str, key: object) -> bytes:
    """32 raw bytes from ``key`` (raw, or url-safe base64 of 32 bytes); never echoes the key."""
    if isinstance(key, str):
        try:
            key = key.encode("ascii")
        except UnicodeEncodeError:
            msg = f"key {key_id!r} is not url-safe base64 (it has non-ASCII characters)"
            raise ValueError(msg) from None
    if not isinstance(key, bytes | bytearray):
        msg = f"key {key_id!r} must be bytes or str, got {type(key).__name__}"
        raise TypeError(msg)
    raw = bytes(key)
    if len(raw) == KEY_BYTES:
        return raw
    stripped = raw.rstrip(b"=")
    try:
        decoded = base64.urlsafe_b64decode(stripped + b"=" * (-len(stripped) % 4))
    except (binascii.Error, ValueError):
        decoded = b""
    if base64.urlsafe_b64encode(decoded).rstrip(b"=") != stripped:
        decoded = b""  # not canonical base64 (stray characters, standard alphabet, trailing data)
    if len(decoded) != KEY_BYTES:
        msg = (
            f"key {key_id!r} must be {KEY_BYTES} random bytes, raw or url-safe base64 "
            '(make one with: python -c "from agents_memory import Keyring; '
            'print(Keyring.generate_key())")'
        )
        raise ValueError(msg)
    return decoded


def is_envelope(data: object) -> bool:
    """Whether a stored value is an encrypted envelope (of any format version)."""
    return isinstance(data, str) and data.startswith(ENVELOPE_MARK) and bool(_ENVELOPE.match(data))


def envelope_key_id(data: str) -> str:
    """The key id an envelope names (``?`` when it is too damaged to say)."""
    parts = data.split(":", 3)
    return parts[1] if len(parts) == 4 else "?"  # noqa: PLR2004 - format, id, check, body


class Keyring:
    """Named AES-256-GCM keys: reads open rows under any of them, writes use ``current``.

    ``Keyring({"2026-11": old_key, "2026-12": new_key}, current="2026-12")``. Key
    ids are 1-64 characters of letters, digits, ``.``, ``_`` and ``-`` (they are
    stored in every envelope, so pick dates or counters, not secrets).

    ``cache_size`` (default 1024, ``0`` turns it off) keeps the plaintext of recently
    opened envelopes (oldest out first, but one re-read at least once every
    ``cache_size // 2`` new envelopes keeps its place), keyed by the exact stored
    envelope text, so re-reading the latest items of a conversation (what an agent
    does every turn) skips base64 and AES-GCM: a cache hit is one lock-free dict
    lookup and a full-text compare (``benchmarks/README.md`` has the instruction
    counts). Only envelopes that authenticated are cached (a tampered or wrong-key row
    raises every time), and envelopes over 16 KiB are not cached at all.

    The trade-off: up to ``cache_size`` decrypted items (at most 16 KiB each) stay in
    this process's memory after the read that needed them, even after the rows are
    deleted, until newer reads evict them; a core dump or a memory-reading attacker
    sees them. Pass ``cache_size=0`` when that matters more than read speed. The cache
    is shared by :meth:`with_current` copies and is safe to use from the event loop
    and ``SQLiteSession`` worker threads at once.
    """

    __slots__ = ("_aad", "_cache", "_ciphers", "_current", "_headers")

    def __init__(
        self, keys: Mapping[str, bytes | str], current: str, *, cache_size: int = 1024
    ) -> None:
        if not isinstance(keys, Mapping) or not keys:
            msg = "keys must be a non-empty mapping of key id to key"
            raise ValueError(msg)
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 0:
            msg = f"cache_size must be an int >= 0 (0 turns the cache off), got {cache_size!r}"
            raise ValueError(msg)
        aesgcm = _aesgcm()
        ciphers: dict[str, Any] = {}
        headers: dict[str, str] = {}
        for key_id, key in keys.items():
            if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):
                msg = f"key id {key_id!r} must be 1-64 characters of letters, digits, '.', '_', '-'"
                raise ValueError(msg)
            raw = _key_bytes(key_id, key)
            check = hmac.new(raw, _CHECK_INFO, hashlib.sha256).digest()[:6]
            headers[key_id] = f"{FORMAT}:{key_id}:{base64.urlsafe_b64encode(check).decode()}"
            ciphers[key_id] = aesgcm(raw)
        if current not in ciphers:
            msg = f"current key id {current!r} is not one of the keyring's ids {sorted(ciphers)}"
            raise ValueError(msg)
        self._ciphers = ciphers
        self._headers = headers
        self._aad = {key_id: header.encode() for key_id, header in headers.items()}
        self._current = current
        self._cache = _OpenedCache(cache_size) if cache_size else None

    @staticmethod
    def generate_key() -> str:
        """A new random key, url-safe base64 (the form ``Fernet.generate_key()`` has)."""
        return base64.urlsafe_b64encode(os.urandom(KEY_BYTES)).decode("ascii")

    @property
    def current(self) -> str:
        """The id of the key new items are written under."""
        return self._current

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Every key id this keyring can read."""
        return tuple(self._ciphers)

    def with_current(self, key_id: str) -> Keyring:
        """The same keys, writing under ``key_id`` (what ``rotate`` encrypts to)."""
        if key_id not in self._ciphers:
            msg = f"key id {key_id!r} is not in the keyring (it has {sorted(self._ciphers)})"
            raise MissingKeyError(msg, key_id=key_id)
        other = Keyring.__new__(Keyring)
        other._ciphers = self._ciphers  # noqa: SLF001 - same class
        other._headers = self._headers  # noqa: SLF001
        other._aad = self._aad  # noqa: SLF001
        other._current = key_id  # noqa: SLF001
        other._cache = self._cache  # noqa: SLF001
        return other

    def header(self, key_id: str | None = None) -> str:
        """``am1:<id>:<check>``: how envelopes under ``key_id`` (default: current) begin."""
        return self._headers[self._current if key_id is None else key_id]

    @property
    def cache_size(self) -> int:
        """How many opened envelopes the cache keeps (0: no cache)."""
        return 0 if self._cache is None else self._cache.size

    def __repr__(self) -> str:
        return (
            f"Keyring(key_ids={sorted(self._ciphers)!r}, current={self._current!r}, "
            f"cache_size={self.cache_size})"
        )

    # -- sealing ------------------------------------------------------------------------------

    def encrypt(self, text: str) -> str:
        """Seal one encoded item under the current key."""
        key_id = self._current
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._ciphers[key_id].encrypt(nonce, text.encode(), self._aad[key_id])
        return f"{self._headers[key_id]}:{b2a_base64(nonce + sealed, newline=False).decode()}"

    def encrypt_all(self, data: list[str]) -> list[str]:
        """Seal a batch of encoded items.

        The batch's nonces come from one ``os.urandom`` call (one system call instead
        of one per item), cut into 12-byte pieces: each is still 96 fresh random bits.
        """
        key_id = self._current
        seal, aad, header = self._ciphers[key_id].encrypt, self._aad[key_id], self._headers[key_id]
        nonces = os.urandom(_NONCE_BYTES * len(data))
        prefix = header + ":"
        out = []
        for i, text in enumerate(data):
            nonce = nonces[i * _NONCE_BYTES : (i + 1) * _NONCE_BYTES]
            body = b2a_base64(nonce + seal(nonce, text.encode(), aad), newline=False)
            out.append(prefix + body.decode("ascii"))
        return out

    def check(self, data: str, *, row_id: object = "?") -> None:
        """Raise the typed error :meth:`decrypt` would for a key this keyring lacks, or a wrong one.

        No decryption: a look at the header. What a delete (clear) checks first.
        """
        header, _, _ = data.rpartition(":")
        key_id = envelope_key_id(data)
        if not data.startswith(f"{FORMAT}:"):
            msg = (
                f"stored item {row_id} is in an encryption format this version does not read "
                f"({data.split(':', 1)[0]!r}); upgrade agents-memory"
            )
            raise DecryptionError(msg, key_id=key_id)
        known = self._headers.get(key_id)
        if known is None:
            msg = (
                f"stored item {row_id} is encrypted under key id {key_id!r}, which is not in "
                f"the keyring (it has {sorted(self._headers)}); add that key to the keyring"
            )
            raise MissingKeyError(msg, key_id=key_id)
        if header != known:
            msg = (
                f"stored item {row_id} is encrypted under key id {key_id!r}, but the keyring's "
                f"key {key_id!r} is a different key; supply the key it was written with"
            )
            raise DecryptionError(msg, key_id=key_id)

    def decrypt(self, data: str, *, row_id: object = "?", cache: bool = True) -> str:
        """Open one envelope; the typed error names the key id (and never the key).

        A hit in the cache of opened envelopes returns without decrypting; the text
        is the exact envelope that authenticated before, so the answer is the same.
        ``cache=False`` neither reads nor fills it (rotation: rows it opens once and
        rewrites would only push the conversations being read out of it).
        """
        store = self._cache
        if store is None or not cache or len(data) > CACHE_MAX_ENVELOPE:
            return self._open(data, row_id=row_id)
        # the hot path, lock-free (see _OpenedCache): one dict.get and a full-text compare
        entry = store.entries.get(data[-_TAIL:])
        if entry is not None and entry[0] == data:
            if store.seq - entry[2] >= store.stale:
                store.put(data, entry[1])  # second chance: it is being read, keep it young
            return entry[1]
        plain = self._open(data, row_id=row_id)
        store.put(data, plain)
        return plain

    def _open(self, data: str, *, row_id: object) -> str:
        parts = data.split(":", 3)
        if len(parts) == 4:  # noqa: PLR2004 - format, id, check, body
            key_id = parts[1]
            header = self._headers.get(key_id)
            if header is not None and data.startswith(header) and data[len(header)] == ":":
                try:
                    blob = a2b_base64(parts[3], strict_mode=True)
                    plain: bytes = self._ciphers[key_id].decrypt(
                        blob[:_NONCE_BYTES], blob[_NONCE_BYTES:], self._aad[key_id]
                    )
                    return plain.decode()
                except (ValueError, binascii.Error, _invalid_tag()):
                    msg = (
                        f"stored item {row_id} under key id {key_id!r} failed authentication: "
                        "it was altered or damaged after it was written"
                    )
                    raise DecryptionError(msg, key_id=key_id) from None
        self.check(data, row_id=row_id)  # raises: the header names no key of ours
        msg = f"stored item {row_id} is not an encrypted envelope this version reads"
        raise DecryptionError(msg, key_id=envelope_key_id(data))


def _invalid_tag() -> type[Exception]:
    """``cryptography``'s authentication failure (installed: a keyring exists)."""
    from cryptography.exceptions import InvalidTag  # noqa: PLC0415

    return InvalidTag


def no_keyring_error(data: str, *, row_id: object) -> MissingKeyError:
    """What a store without encryption raises on an encrypted row (instead of ciphertext)."""
    key_id = envelope_key_id(data)
    msg = (
        f"stored item {row_id} is encrypted (key id {key_id!r}) but this store was opened "
        "without encryption: pass encryption=Keyring(...) holding that key"
    )
    return MissingKeyError(msg, key_id=key_id)


def open_envelope(data: str, keyring: Keyring | None, *, row_id: object) -> str:
    """The encoded item inside ``data``, or the typed error why it cannot be had."""
    if keyring is None:
        raise no_keyring_error(data, row_id=row_id)
    return keyring.decrypt(data, row_id=row_id)


def check_deletable(data: object, keyring: Keyring | None, *, row_id: object) -> None:
    """Refuse to delete an envelope this keyring could not open (a plaintext row passes)."""
    if not is_envelope(data):
        return
    if keyring is None:
        raise no_keyring_error(str(data), row_id=row_id)
    keyring.check(str(data), row_id=row_id)
