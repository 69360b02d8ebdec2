"""Printing: rich for people (tables, a progress bar on a terminal), plain JSON for programs."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import sys
from collections.abc import Iterator
from typing import Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichProgress
from rich.text import Text

from agents_memory._admin._types import NoProgress, Progress

WIDE = 200
"""Width for output that is not a terminal: rows stay on one line for grep and friends."""


def out() -> Console:
    """A console on the current standard output (looked up per call: tests swap it)."""
    return Console(file=sys.stdout, highlight=False, width=None if _tty(sys.stdout) else WIDE)


def err() -> Console:
    """A console on the current standard error."""
    return Console(file=sys.stderr, highlight=False, width=None if _tty(sys.stderr) else WIDE)


def _tty(stream: Any) -> bool:  # noqa: ANN401 - any file-like object
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def _default(value: object) -> object:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    msg = f"cannot print {type(value).__name__} as JSON"
    raise TypeError(msg)


def json_text(data: object, *, indent: int | None = 2) -> str:
    """JSON with non-ASCII text as is (escaped only where it could not be UTF-8)."""
    text = json.dumps(data, ensure_ascii=False, indent=indent, default=_default)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: keep it exactly, as \\u escapes
        text = json.dumps(data, ensure_ascii=True, indent=indent, default=_default)
    return text


def print_json(data: object) -> None:
    """Print one JSON document on standard output."""
    typer.echo(json_text(data))


def plural(n: int, word: str) -> str:
    """``1 session``, ``2 sessions``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def when(value: dt.datetime | None) -> str:
    """A time for people: to the second, as stored (UTC by the store's convention)."""
    return "-" if value is None else value.isoformat(sep=" ", timespec="seconds")


class _Rate(ProgressColumn):
    """Items per second."""

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        return Text("- items/s" if speed is None else f"{speed:,.0f} items/s", style="cyan")


class _Bar:
    """The operations' :class:`Progress` drawn as a rich bar."""

    def __init__(self, bar: RichProgress, label: str) -> None:
        self._bar = bar
        self._task = bar.add_task(label, total=None)

    def start(self, total: int | None) -> None:
        self._bar.update(self._task, total=total)

    def advance(self, items: int) -> None:
        self._bar.advance(self._task, items)


def show_progress(*, data_on_stdout: bool = False, json_output: bool = False) -> bool:
    """Draw a bar only for a person watching: stderr (and stdout, unless it is data) a terminal."""
    if json_output or not _tty(sys.stderr):
        return False
    return data_on_stdout or _tty(sys.stdout)


EXIT_INTERRUPTED = 130
"""The exit code after Ctrl-C, as shells give a process ended by SIGINT (128 + 2)."""
INTERRUPTED = "interrupted; run the same command again to finish (copy and import resume)"
"""What Ctrl-C prints (on stderr, after ``error:``)."""


@contextlib.contextmanager
def progress(label: str, *, enabled: bool) -> Iterator[Progress]:
    """A progress reporter: a bar with counts and rate on stderr, or nothing."""
    if not enabled:
        yield NoProgress()
        return
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("items"),
        _Rate(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    # transient: stopping it erases it, so an error or the summary is never drawn under it
    with RichProgress(*columns, console=err(), transient=True) as bar:
        _live.append(bar)
        try:
            yield _Bar(bar, label)
        except KeyboardInterrupt:
            # Ctrl-C between the first drawing of the bar and the start of the work
            # (run() handles it during the work): the same notice and exit code.
            stop_progress()
            err().print(Text.assemble(("error: ", "bold red"), INTERRUPTED), soft_wrap=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        finally:
            if bar in _live:
                _live.remove(bar)


_live: list[RichProgress] = []
"""The progress bar on screen, if any (one command draws at most one)."""


def stop_progress() -> None:
    """Erase the progress bar now: before an error message or the Ctrl-C notice."""
    while _live:
        _live.pop().stop()
