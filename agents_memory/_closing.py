"""``async with`` for every object whose ``close()`` is a coroutine: written once."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class AsyncClosing:
    """Mixin: ``async with obj:`` awaits ``obj.close()`` on the way out, error or not."""

    async def close(self) -> None:
        """Release what the object owns (subclasses say what)."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
