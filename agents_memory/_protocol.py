"""The Session protocol, structurally identical to the OpenAI Agents SDK's.

Kept free of any database import so that every backend (and every user's own
implementation) can depend on it without pulling in SQLAlchemy.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, Protocol, TypeAlias, runtime_checkable

from openai.types.responses import ResponseInputItemParam

TResponseInputItem: TypeAlias = ResponseInputItemParam
"""One Responses-API input item: a plain JSON-serialisable dict."""


@dataclasses.dataclass(frozen=True)
class SessionSettings:
    """Per-session defaults that the Agents SDK's ``Runner`` reads.

    The ``Runner`` merges its own ``RunConfig.session_settings`` over ours with
    :meth:`resolve`, so the method accepts the SDK's settings object or a dict as
    well as ours.
    """

    limit: int | None = None
    """Items returned by ``get_items()`` when no explicit limit is given; ``None`` is all."""

    def __post_init__(self) -> None:
        if self.limit is not None and (
            isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 0
        ):
            msg = f"SessionSettings.limit must be a non-negative int or None, got {self.limit!r}"
            raise ValueError(msg)

    def resolve(self, override: object) -> SessionSettings:
        """Overlay the non-``None`` values of ``override`` (settings, dict or None) on these."""
        if override is None:
            return self
        if isinstance(override, Mapping):
            limit = override.get("limit")
        else:
            limit = getattr(override, "limit", None)
        if limit is None:
            return self
        return dataclasses.replace(self, limit=limit)

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict form, as the SDK's settings offer it."""
        return dataclasses.asdict(self)


def resolve_limit(explicit: int | None, settings: SessionSettings | None) -> int | None:
    """Apply the protocol's limit rule: an explicit limit wins over the settings."""
    if explicit is not None:
        if isinstance(explicit, bool) or not isinstance(explicit, int):
            msg = f"limit must be an int or None, got {type(explicit).__name__}"
            raise TypeError(msg)
        if explicit < 0:
            msg = f"limit must be >= 0, got {explicit}"
            raise ValueError(msg)
        return explicit
    return settings.limit if settings is not None else None


@runtime_checkable
class Session(Protocol):
    """What the Agents SDK's ``Runner`` needs from a conversation store."""

    session_id: str
    session_settings: SessionSettings | None

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """Return the latest ``limit`` items (all when ``None``), oldest first."""
        ...

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` in order."""
        ...

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item, or ``None`` when empty."""
        ...

    async def clear_session(self) -> None:
        """Remove the session and every item in it."""
        ...


class SessionABC(ABC):
    """The same contract as :class:`Session`, as a base class to inherit from."""

    session_id: str
    session_settings: SessionSettings | None = None

    @abstractmethod
    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """Return the latest ``limit`` items (all when ``None``), oldest first."""

    @abstractmethod
    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` in order."""

    @abstractmethod
    async def pop_item(self) -> TResponseInputItem | None:
        """Remove and return the newest item, or ``None`` when empty."""

    @abstractmethod
    async def clear_session(self) -> None:
        """Remove the session and every item in it."""
