"""Running an operation: one clear sentence and exit code 1 on failure, never a secret.

Every command runs its coroutine through :func:`run`. A known error prints its
message (which names the next step); an unknown one says so and points at
``--debug``, which lets the traceback through instead. Any password in a URL
the command was given is replaced by ``***`` in whatever is printed.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine, Iterable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar
from urllib.parse import quote_plus

import typer
from rich.text import Text

from agents_memory._admin._keys import KEYS_ENV, KEYS_FILE_ENV
from agents_memory._cli._options import globals_of, raw_url
from agents_memory._cli._output import EXIT_INTERRUPTED, INTERRUPTED, err, stop_progress
from agents_memory._errors import AgentsMemoryError, DecryptionError
from agents_memory._urls import url_secrets

if TYPE_CHECKING:
    from sqlalchemy.exc import SQLAlchemyError

T = TypeVar("T")

EXIT_ERROR = 1
_CHECK = "check --url and that the server is running"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _database(exc: SQLAlchemyError) -> str:
    from sqlalchemy.exc import DBAPIError  # noqa: PLC0415 - loaded by then: it raised

    if isinstance(exc, DBAPIError):
        reason = _first_line(exc.orig) if exc.orig is not None else _first_line(exc)
        if exc.statement is None or exc.connection_invalidated:
            return f"cannot connect to the database ({reason}); {_CHECK}"
        return f"the database refused the operation ({reason}); --debug shows the statement"
    return f"database error ({_first_line(exc)}); --debug shows the details"


def _os(exc: OSError) -> str:
    if isinstance(exc, ConnectionError | TimeoutError) or exc.filename is None:
        return f"cannot connect to the database ({_first_line(exc)}); {_CHECK}"
    return f"{exc.strerror or _first_line(exc)}: {exc.filename}; check the path"


def explain(exc: BaseException) -> str:
    """One sentence for an error: what went wrong and what to do next."""
    sqlalchemy_exc = sys.modules.get("sqlalchemy.exc")  # not loaded: not its error
    if isinstance(exc, DecryptionError):
        text = f"{exc} (the CLI reads keys from --keys-file, ${KEYS_FILE_ENV} or ${KEYS_ENV})"
    elif isinstance(exc, AgentsMemoryError):
        text = str(exc)
    elif sqlalchemy_exc is not None and isinstance(exc, sqlalchemy_exc.SQLAlchemyError):
        text = _database(exc)
    elif isinstance(exc, OSError):
        text = _os(exc)
    elif isinstance(exc, ValueError | TypeError | LookupError):
        text = _first_line(exc)
    else:
        text = (
            f"unexpected {type(exc).__name__}: {_first_line(exc)}; "
            "re-run with --debug for the traceback, and please report it"
        )
    return text


def _passwords(urls: Iterable[str]) -> set[str]:
    found: set[str] = set()
    for url in urls:
        for secret in url_secrets(url):
            found |= {secret, quote_plus(secret)}
    return found


def scrub(text: str, urls: Iterable[str]) -> str:
    """Replace every password of ``urls`` in ``text`` with ``***``."""
    for password in sorted(_passwords(urls), key=len, reverse=True):
        text = text.replace(password, "***")
    return text


def fail(message: str, *, code: int = EXIT_ERROR) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``."""
    err().print(Text.assemble(("error: ", "bold red"), message), soft_wrap=True)
    raise typer.Exit(code)


def run(ctx: typer.Context, work: Coroutine[Any, Any, T], *, urls: Iterable[str] = ()) -> T:
    """Run ``work`` to completion, turning failures into a sentence and an exit code."""
    debug = globals_of(ctx).debug
    known = [raw_url(ctx), *urls]
    try:
        return asyncio.run(work)
    except (typer.Exit, typer.Abort, BrokenPipeError):
        raise  # click's own handling (a closed pipe, as in `… | head`, ends quietly)
    except KeyboardInterrupt:
        stop_progress()
        if debug:
            raise
        fail(INTERRUPTED, code=EXIT_INTERRUPTED)
    except Exception as exc:
        stop_progress()
        if debug:
            raise
        fail(scrub(explain(exc), known))
