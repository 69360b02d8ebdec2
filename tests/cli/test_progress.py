"""The progress bar: drawn for a person at a terminal, absent when output is piped."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pty
import select
import signal
import sys
import threading
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent / "agents-memory"


def read_all(fd: int) -> str:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


async def test_copy_draws_a_bar_on_a_terminal_only(cli, sqlite_source: str) -> None:
    """On a terminal, copy shows counts and a rate; piped, it prints only its summary line."""
    source = sqlite_source
    args = [*cli.store_args, "copy", "--from", source, "--to", cli.url, "--batch", "500"]
    env = {**os.environ, "COLUMNS": "160", "TERM": "xterm"}
    leader, follower = pty.openpty()
    on_terminal = await asyncio.create_subprocess_exec(
        BIN, *args, stdin=follower, stdout=follower, stderr=follower, env=env
    )
    os.close(follower)
    screen = await asyncio.to_thread(read_all, leader)
    os.close(leader)
    assert await on_terminal.wait() == 0, screen
    assert "copy" in screen
    assert "10000/10000" in screen
    assert "items/s" in screen

    piped = await asyncio.create_subprocess_exec(
        BIN, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env
    )
    stdout, stderr = await piped.communicate()
    assert piped.returncode == 0, stderr
    assert stderr == b""
    assert stdout.count(b"\n") == 1
    assert b"items/s" not in stdout


def process_state(pid: int) -> str:
    """The process's state as Linux reports it (``S (sleeping)``, ``Z (zombie)``…)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text(encoding="ascii")
    except OSError as exc:
        return f"unknown ({exc})"
    return next(
        (
            line.split(":", 1)[1].strip()
            for line in status.splitlines()
            if line.startswith("State:")
        ),
        "unknown",
    )


class Terminal:
    """The leader side of a pty, read by a thread from start to end.

    Reading all along means the child can never block on a full terminal (the
    bar redraws ten times a second), and whatever it printed is at hand when a
    check fails.
    """

    def __init__(self, leader: int) -> None:
        self._fd = leader
        self._data = bytearray()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            if not select.select([self._fd], [], [], 0.05)[0]:
                continue
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:  # every holder of the follower side has closed it
                return
            if not chunk:
                return
            with self._lock:
                self._data += chunk

    def text(self) -> str:
        """Everything read so far."""
        with self._lock:
            return bytes(self._data).decode("utf-8", "replace")

    def size(self) -> int:
        """How many bytes were read so far."""
        with self._lock:
            return len(self._data)

    async def shows(self, marker: str) -> None:
        """Return once ``marker`` is on screen (fail if the terminal closes first)."""
        while marker not in self.text():
            alive = self._thread.is_alive()
            assert alive, f"the terminal closed before {marker!r}: {self.text()!r}"
            await asyncio.sleep(0.01)

    async def settle(self, quiet: float = 0.5) -> None:
        """Stop reading once nothing new has arrived for ``quiet`` seconds."""
        seen = -1
        while self.size() != seen and self._thread.is_alive():
            seen = self.size()
            await asyncio.sleep(quiet)
        self._stop.set()
        await asyncio.to_thread(self._thread.join)


async def test_ctrl_c_erases_the_bar_then_says_so_and_exits_130(cli, sqlite_source: str) -> None:
    """Ctrl-C during a copy on a terminal: the bar is erased first, then one line, exit 130."""
    args = [*cli.store_args, "copy", "--from", sqlite_source, "--to", cli.url, "--batch", "5"]
    # PYTHONFAULTHANDLER: if it ever hangs, SIGABRT makes it print every thread's stack
    env = {**os.environ, "COLUMNS": "160", "TERM": "xterm", "PYTHONFAULTHANDLER": "1"}
    leader, follower = pty.openpty()
    proc = await asyncio.create_subprocess_exec(
        BIN, *args, stdin=follower, stdout=follower, stderr=follower, env=env
    )
    # The follower stays open here until the end: once every holder of it has closed,
    # Linux may drop what the child wrote last before it is read.
    terminal = Terminal(leader)
    try:
        async with asyncio.timeout(60):
            await terminal.shows("items/s")  # the bar is on screen
        proc.send_signal(signal.SIGINT)
        try:
            code = await asyncio.wait_for(proc.wait(), timeout=60)
        except TimeoutError:
            state = process_state(proc.pid)  # a zombie: it exited, but the wait missed it
            proc.send_signal(signal.SIGABRT)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), timeout=30)
            await terminal.settle()
            pytest.fail(
                f"no exit seen within 60 s of Ctrl-C (its state then: {state}); "
                f"the terminal, with its threads' stacks if it hung:\n{terminal.text()[-6000:]}"
            )
        await terminal.settle()  # what is left
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await terminal.settle(quiet=0)
        os.close(follower)
        os.close(leader)
    screen = terminal.text()
    assert code == 130, screen
    assert "interrupted; run the same command again" in screen, repr(screen[-700:])
    notice = screen.index("interrupted; run the same command again")
    after = screen[notice:]
    assert "items/s" not in after  # nothing of the bar is drawn after the message
    erase = screen.rfind("\x1b[2K", 0, notice)  # rich erases its lines when it stops
    assert erase != -1, repr(screen[-400:])
    assert "items/s" not in screen[erase:notice]
