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
    assert repr(ring) == "Keyring(key_ids=['a', 'b'], current='b', cache_size=1024)"


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


# -- the cache of opened envelopes --------------------------------------------------------------


def _cached(ring: Keyring) -> int:
    return 0 if ring._cache is None else len(ring._cache)


def test_cache_keeps_only_authenticated_envelopes() -> None:
    ring = Keyring({"a": Keyring.generate_key()}, current="a", cache_size=4)
    sealed = ring.encrypt('{"a":1}')
    assert ring.decrypt(sealed) == ring.decrypt(sealed) == '{"a":1}'
    assert _cached(ring) == 1
    # one changed character is another key of the cache: a miss, and authentication fails
    flipped = sealed[:-3] + ("A" if sealed[-3] != "A" else "B") + sealed[-2:]
    for _ in range(2):
        with pytest.raises(DecryptionError, match="failed authentication"):
            ring.decrypt(flipped)
    # a wrong key under the same id is refused every time, cached or not
    other = Keyring({"a": Keyring.generate_key()}, current="a", cache_size=4)
    for _ in range(2):
        with pytest.raises(DecryptionError, match="different key"):
            other.decrypt(sealed)
    assert _cached(ring) == 1
    assert _cached(other) == 0


def test_cache_is_lru_bounded_skips_big_envelopes_and_can_be_off() -> None:
    ring = Keyring({"a": Keyring.generate_key()}, current="a", cache_size=2)
    one, two, three = (ring.encrypt(f'{{"n":{n}}}') for n in (1, 2, 3))
    ring.decrypt(one)
    ring.decrypt(two)
    ring.decrypt(one)  # one is now the most recent: three evicts two
    ring.decrypt(three)
    cache = ring._cache
    assert cache is not None
    assert len(cache) == 2
    assert one in cache
    assert three in cache
    assert two not in cache
    big = ring.encrypt('{"t":"' + "x" * 16_000 + '"}')
    assert len(big) > 16 * 1024
    assert ring.decrypt(big).startswith('{"t":"xx')
    assert big not in cache
    assert ring.decrypt(one, cache=False) == '{"n":1}'
    off = Keyring({"a": Keyring.generate_key()}, current="a", cache_size=0)
    assert off.cache_size == 0
    assert off.decrypt(off.encrypt("{}")) == "{}"
    assert _cached(off) == 0
    # with_current shares the cache (same keys, same answers)
    assert ring.with_current("a").cache_size == 2
    assert ring.with_current("a")._cache is ring._cache


def test_cache_hit_needs_the_whole_text_not_just_its_tail() -> None:
    """The cache is indexed by the tail; a row altered before it still fails, every time."""
    ring = Keyring({"a": Keyring.generate_key()}, current="a", cache_size=4)
    sealed = ring.encrypt('{"a":"' + "x" * 200 + '"}')
    assert ring.decrypt(sealed).startswith('{"a":"xx')  # now cached
    mid = len(sealed) // 2
    altered = sealed[:mid] + ("A" if sealed[mid] != "A" else "B") + sealed[mid + 1 :]
    assert altered[-24:] == sealed[-24:]
    for _ in range(3):
        with pytest.raises(DecryptionError, match="failed authentication"):
            ring.decrypt(altered)
    assert ring.decrypt(sealed).startswith('{"a":"xx')  # the genuine one still answers


def test_cache_gives_entries_being_read_a_second_chance() -> None:
    """An envelope read at least once every size // 2 new ones is never evicted."""
    ring = Keyring({"a": Keyring.generate_key()}, current="a", cache_size=8)
    hot = ring.encrypt('{"hot":1}')
    ring.decrypt(hot)
    cache = ring._cache
    assert cache is not None
    for n in range(100):
        ring.decrypt(ring.encrypt(f'{{"n":{n}}}'))
        if n % 4 == 3:
            ring.decrypt(hot)
        assert hot in cache
        assert len(cache) <= 8
    cold = ring.encrypt('{"cold":1}')
    ring.decrypt(cold)
    for n in range(8):
        ring.decrypt(ring.encrypt(f'{{"m":{n}}}'))
    assert cold not in cache
    assert len(cache) == 8


@pytest.mark.parametrize("size", [-1, 1.5, True, "10"])
def test_bad_cache_size_is_refused(size: object) -> None:
    with pytest.raises(ValueError, match="cache_size"):
        Keyring({"a": Keyring.generate_key()}, current="a", cache_size=size)  # type: ignore[arg-type]


def test_cache_from_many_threads_at_once_answers_right() -> None:
    """A small LRU churned from 8 threads neither breaks nor mixes up answers.

    SQLiteSession workers and the event loop may share one keyring.
    """
    import threading  # noqa: PLC0415

    ring = Keyring({"a": Keyring.generate_key()}, current="a", cache_size=8)
    sealed = [(ring.encrypt(f'{{"n":{n}}}'), f'{{"n":{n}}}') for n in range(40)]
    errors: list[str] = []
    barrier = threading.Barrier(8)

    def work(offset: int) -> None:
        barrier.wait()
        for i in range(2_000):
            env, plain = sealed[(i * 7 + offset) % len(sealed)]
            if ring.decrypt(env) != plain:
                errors.append(plain)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert _cached(ring) == 8
