"""The protocol types: settings resolution and the public surface."""

from __future__ import annotations

import pytest

import agents_memory
from agents_memory import Session, SessionABC, SessionSettings


def test_settings_resolve_overlays_non_none() -> None:
    """resolve() takes ours, a dict or any object with .limit, ignoring None values."""
    base = SessionSettings(limit=5)
    assert base.resolve(None) is base
    assert base.resolve(SessionSettings()) == base
    assert base.resolve({"limit": 2}).limit == 2
    assert base.resolve(type("Other", (), {"limit": 7})()).limit == 7
    assert base.to_dict() == {"limit": 5}


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True])
def test_settings_reject_bad_limits(bad: object) -> None:
    """A negative or non-int limit is refused when the settings are made."""
    with pytest.raises(ValueError, match="limit"):
        SessionSettings(limit=bad)  # type: ignore[arg-type]


def test_abc_cannot_be_instantiated_half_done() -> None:
    """A SessionABC subclass missing a method cannot be created."""

    class Half(SessionABC):
        async def get_items(self, limit: int | None = None) -> list:  # type: ignore[type-arg]  # noqa: ARG002
            return []

    with pytest.raises(TypeError):
        Half()  # type: ignore[abstract]


def test_public_api_is_exported() -> None:
    """Everything in __all__ exists, and the version comes from the package metadata."""
    for name in agents_memory.__all__:
        assert hasattr(agents_memory, name), name
    assert agents_memory.__version__ != "0.0.0"
    assert Session is agents_memory.Session
