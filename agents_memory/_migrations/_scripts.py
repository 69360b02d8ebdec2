"""Finding the revision scripts, in a wheel or in a source checkout."""

from __future__ import annotations

import functools
from pathlib import Path

from alembic.config import Config
from alembic.script import ScriptDirectory

_PACKAGE = Path(__file__).resolve().parent.parent


def script_location() -> Path:
    """The folder holding ``env.py`` and ``versions/``.

    A wheel carries the repository's top-level ``alembic/`` folder as
    ``agents_memory/_alembic`` (see pyproject.toml); a source checkout or an
    editable install uses the top-level folder itself.
    """
    for candidate in (_PACKAGE / "_alembic", _PACKAGE.parent / "alembic"):
        if (candidate / "env.py").is_file() and (candidate / "versions").is_dir():
            return candidate
    msg = (
        f"agents_memory's migration scripts are missing from {_PACKAGE}; "
        "reinstall the package (pip install --force-reinstall agents-memory)"
    )
    raise RuntimeError(msg)


def make_config() -> Config:
    """An Alembic config pointing at our scripts, independent of any alembic.ini."""
    config = Config()
    config.set_main_option("script_location", str(script_location()))
    return config


@functools.cache
def script_directory() -> ScriptDirectory:
    """The parsed revision scripts (parsed once per process)."""
    return ScriptDirectory.from_config(make_config())


def head_revision() -> str:
    """The newest revision this version of the package knows."""
    head = script_directory().get_current_head()
    if head is None:  # pragma: no cover - the package always ships revisions
        msg = "no migration revisions found"
        raise RuntimeError(msg)
    return head
