"""The Keyring and the envelope: key forms, validation, and what an envelope holds."""

from __future__ import annotations

import base64
import os

import pytest
from cryptography.fernet import Fernet

from agents_memory import DecryptionError, Keyring, MissingKeyError
from agents_memory._crypto import envelope_key_id, is_envelope


def test_keys_raw_or_base64_open_each_others_envelopes() -> None:
    raw = os.urandom(32)
    as_text = base64.urlsafe_b64encode(raw).decode()
    one = Keyring({"k": raw}, current="k")
    two = Keyring({"k": as_text}, current="k")
    three = Keyring({"k": as_text.rstrip("=").encode()}, current="k")
    sealed = one.encrypt('{"a":1}')
    assert two.decrypt(sealed) == three.decrypt(sealed) == '{"a":1}'
    assert is_envelope(sealed)
    assert envelope_key_id(sealed) == "k"
    assert sealed.startswith(one.header() + ":")


def test_fernet_keys_work() -> None:
    key = Fernet.generate_key()
    ring = Keyring({"f": key, "g": key.decode()}, current="g")
    assert ring.decrypt(ring.encrypt("{}")) == "{}"


def test_nonce_is_fresh_and_writes_use_current() -> None:
    ring = Keyring({"a": Keyring.generate_key(), "b": Keyring.generate_key()}, current="b")
    first, second = ring.encrypt("{}"), ring.encrypt("{}")
    assert first != second
    assert envelope_key_id(first) == "b"
    assert envelope_key_id(ring.with_current("a").encrypt("{}")) == "a"
    assert ring.key_ids == ("a", "b")
    assert repr(ring) == "Keyring(key_ids=['a', 'b'], current='b')"


@pytest.mark.parametrize(
    ("keys", "current", "error", "match"),
    [
        ({}, "a", ValueError, "non-empty"),
        ({"a": b"short"}, "a", ValueError, "'a' must be 32 random bytes"),
        ({"a": "not base64 at all!!"}, "a", ValueError, "'a' must be 32"),
        ({"a": "é" * 44}, "a", ValueError, "non-ASCII"),
        ({"a": 42}, "a", TypeError, "bytes or str"),
        ({"a:b": os.urandom(32)}, "a:b", ValueError, "key id 'a:b'"),
        ({"": os.urandom(32)}, "", ValueError, "key id ''"),
        ({"a": os.urandom(32)}, "b", ValueError, "current key id 'b'"),
    ],
)
def test_bad_keyrings_are_refused(keys: dict, current: str, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        Keyring(keys, current=current)


def test_envelope_failures_name_the_key_id() -> None:
    a = Keyring({"a": Keyring.generate_key()}, current="a")
    sealed = a.encrypt("{}")
    with pytest.raises(MissingKeyError, match="'a'"):
        Keyring({"b": Keyring.generate_key()}, current="b").decrypt(sealed)
    with pytest.raises(DecryptionError, match="different key") as info:
        Keyring({"a": Keyring.generate_key()}, current="a").decrypt(sealed)
    assert info.value.key_id == "a"
    with pytest.raises(DecryptionError, match="format"):
        a.decrypt("am9:a:xx:yy")
    with pytest.raises(MissingKeyError):
        a.with_current("zz")
    assert not is_envelope('{"am1:": 1}')
