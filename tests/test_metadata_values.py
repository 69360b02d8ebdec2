"""Session metadata values and filter keys that JSON columns treat differently per database."""

from __future__ import annotations

from typing import Any

import pytest

from agents_memory import SessionStore

EXACT = [0.1, 1.5, -2.5, 1e-7, 5e-324, -2.5e-30, 123456789012345.6, 1e15, 10**30, -(10**20)]
"""Numbers every database gives back exactly (ints of any size; floats without a + exponent)."""


async def test_metadata_numbers_round_trip_exactly(store: SessionStore) -> None:
    """Each number comes back as the same value and the same type (JSONB keeps decimals)."""
    meta = {f"n{i}": value for i, value in enumerate(EXACT)}
    meta["nested"] = {"list": EXACT}
    await store.session("a").set_metadata(meta)
    back = await store.session("a").get_metadata()
    assert back == meta
    for key, value in meta.items():
        if key != "nested":
            assert type(back[key]) is type(value), (key, back[key])
    assert [type(v) for v in back["nested"]["list"]] == [type(v) for v in EXACT]


@pytest.mark.parametrize("value", [1e308, 2.5e30, 1.2345678901234567e19, 1e16, -3e20])
async def test_floats_jsonb_would_turn_into_ints_are_refused(
    store: SessionStore, value: float
) -> None:
    """A float Postgres' JSONB would give back as an int is refused before writing, everywhere."""
    with pytest.raises(ValueError, match="cannot be stored exactly") as info:
        await store.session("a").set_metadata({"deep": [{"x": value}]})
    assert "store it as an int or as a string" in str(info.value)
    assert await store.get_session("a") is None


@pytest.mark.parametrize("key", ["naïve", "用户", "😀", "-1", "a b", "a.b", "$x", "*"])
async def test_filter_keys_beyond_ascii_identifiers_find_their_sessions(
    store: SessionStore, key: str
) -> None:
    """list_sessions(metadata=…) finds a session by any key a filter accepts, on every database."""
    await store.session("hit").set_metadata({key: "v", "other": 1})
    await store.session("miss").set_metadata({key: "w"})

    async def ids(**filters: Any) -> list[str]:
        page = await store.list_sessions(metadata=filters)
        return sorted(i.session_id for i in page.sessions)

    assert await ids(**{key: "v"}) == ["hit"]
    assert await ids(**{key: "v", "other": 1}) == ["hit"]
    assert await ids(**{key: "x"}) == []
