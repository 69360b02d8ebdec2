"""The Agents SDK's session types, as our classes use them, loaded only when needed.

``Session``, ``SessionABC``, ``SessionSettings`` and ``TResponseInputItem`` are the
SDK's own objects (``openai-agents`` is a dependency): one class means the SDK's
settings coercion, ``RunConfig`` and its wrappers accept ours, and ``mypy`` sees the
same types on both sides. Importing the SDK loads ``openai`` and much more (about
2 s), so nothing here imports it at module level: our session classes run on
:class:`SessionBase`, a private ABC with the same abstract methods that the type
checker sees as the SDK's ``SessionABC``, and the SDK is imported the first time
somebody passes settings or asks ``agents_memory`` for one of these names.
"""

from __future__ import annotations

import dataclasses
import sys
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from agents_memory._ids import check_sql_int

if TYPE_CHECKING:
    from agents.items import TResponseInputItem
    from agents.memory import Session, SessionABC, SessionSettings

    SessionBase = SessionABC
else:

    class SessionBase(ABC):
        """Our sessions' runtime base: the SDK's ``SessionABC`` contract without importing it.

        Subclasses are registered as virtual subclasses of the SDK's ``SessionABC``
        once the SDK is loaded (:func:`register_with_sdk`), so ``isinstance`` agrees
        with what the type checker was told.
        """

        session_id: str
        session_settings: SessionSettings | None = None

        def __init_subclass__(cls, **kwargs: Any) -> None:  # noqa: ANN401
            """Register a class defined after the SDK was loaded (our classes load lazily)."""
            super().__init_subclass__(**kwargs)
            register_with_sdk()

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


SDK_NAMES = ("Session", "SessionABC", "SessionSettings", "TResponseInputItem")
"""The names ``agents_memory`` re-exports from the SDK."""


def sdk_object(name: str) -> Any:  # noqa: ANN401 - a class or a type alias, by name
    """Import the SDK (once) and return one of :data:`SDK_NAMES`, registering our classes."""
    import agents.items  # noqa: PLC0415 - the SDK loads openai: only on demand
    import agents.memory  # noqa: PLC0415

    register_with_sdk()
    if name == "TResponseInputItem":
        return agents.items.TResponseInputItem
    return getattr(agents.memory, name)


def register_with_sdk() -> None:
    """Make ``isinstance(ours, agents.SessionABC)`` true, if the SDK is loaded.

    Cheap and idempotent; called when we load the SDK ourselves and when
    ``agents_memory`` is imported after it.
    """
    memory = sys.modules.get("agents.memory")
    if memory is None:
        return
    sdk_abc = memory.SessionABC
    for cls in _subclasses(SessionBase):
        if not issubclass(cls, sdk_abc):
            sdk_abc.register(cls)


def _subclasses(cls: type) -> list[type]:
    found: list[type] = []
    subclasses: list[type] = cls.__subclasses__()
    for sub in subclasses:
        found.append(sub)
        found.extend(_subclasses(sub))
    return found


def coerce_settings(value: object) -> SessionSettings | None:
    """Normalise ``session_settings`` as the SDK's session classes do.

    ``None`` stays ``None`` (without loading the SDK); an SDK ``SessionSettings`` is
    kept; a dict becomes one, and a key it does not know is a ``TypeError`` now
    rather than an ``AttributeError`` at the first read.
    """
    if value is None:
        return None
    settings_cls: type[SessionSettings] = sdk_object("SessionSettings")
    if isinstance(value, settings_cls):
        return value
    if not isinstance(value, dict):
        msg = (
            "session_settings must be an agents.SessionSettings instance or a dict, "
            f"got {type(value).__name__}"
        )
        raise TypeError(msg)
    known = {f.name for f in dataclasses.fields(settings_cls) if f.init}
    unknown = sorted(str(key) for key in value if key not in known)
    if unknown:
        msg = f"Unknown session settings: {', '.join(unknown)}"
        raise TypeError(msg)
    return settings_cls(**value)


def resolve_limit(explicit: int | None, settings: SessionSettings | None) -> int | None:
    """Apply the protocol's limit rule: an explicit limit wins over the settings."""
    limit = explicit if explicit is not None else getattr(settings, "limit", None)
    if limit is None:
        return None
    what = "limit" if explicit is not None else "session_settings.limit"
    if isinstance(limit, bool) or not isinstance(limit, int):
        msg = f"{what} must be an int or None, got {type(limit).__name__}"
        raise TypeError(msg)
    if limit < 0:
        msg = f"{what} must be >= 0, got {limit}"
        raise ValueError(msg)
    check_sql_int(what, limit)  # every session class, the stdlib one included
    return limit


def __getattr__(name: str) -> Any:  # noqa: ANN401 - module attribute, by name
    if name in SDK_NAMES:
        return sdk_object(name)
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)


__all__ = [
    "SDK_NAMES",
    "Session",
    "SessionABC",
    "SessionBase",
    "SessionSettings",
    "TResponseInputItem",
    "coerce_settings",
    "register_with_sdk",
    "resolve_limit",
    "sdk_object",
]


_WRITES = ("add_items", "clear_session", "pop_item", "get_items")


def writes_overridden(cls: type, base: type) -> bool:
    """Whether ``cls`` changes how ``base`` reads or writes items but keeps its ``replace_items``.

    Then an inherited atomic replacement would bypass what the subclass does to
    items (encrypt, index, count turns), so the SDK's compaction hook declines.
    """
    if getattr(cls, "replace_items", None) is not getattr(base, "replace_items", None):
        return False
    return any(getattr(cls, name, None) is not getattr(base, name, None) for name in _WRITES)
