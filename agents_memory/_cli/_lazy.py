"""Modules the CLI loads only when a command runs, so ``--help`` starts fast.

The commands' bodies need SQLAlchemy, Alembic and a driver (about 0.5 s to
import); their option declarations need none of it. A module named here is
created at import time but executed on first attribute access
(``importlib.util.LazyLoader``, the standard library's mechanism), so the
command modules keep plain ``ops.upgrade(...)`` calls and the type checker
sees the real module (each caller imports it under ``TYPE_CHECKING``).
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType


def module(name: str) -> ModuleType:
    """``name``, imported for real the first time one of its attributes is used."""
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:  # pragma: no cover - our own module names
        msg = f"no module named {name!r}"
        raise ModuleNotFoundError(msg)
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    lazy = importlib.util.module_from_spec(spec)
    sys.modules[name] = lazy
    loader.exec_module(lazy)
    return lazy
