"""Fixtures of the store tests: a store on one runner or the other."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event

from agents_memory import SessionStore
from agents_memory._databases.base import observed


def _observe(_conn: Any, _cursor: Any, _statement: str, *_: Any) -> None:
    """An execution listener: the engine is observed, so its statements go through SQLAlchemy."""


@pytest.fixture(params=["driver", "sqlalchemy"])
def rstore(request: pytest.FixtureRequest, store: SessionStore) -> Iterator[SessionStore]:
    """The backend's store on one runner (the driver's, or SQLAlchemy's for an observed engine)."""
    core = request.param == "sqlalchemy"
    if core:
        event.listen(store.engine.sync_engine, "before_cursor_execute", _observe)
    assert observed(store.engine) == core
    yield store
    if core:
        event.remove(store.engine.sync_engine, "before_cursor_execute", _observe)
