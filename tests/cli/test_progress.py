"""The progress bar: drawn for a person at a terminal, absent when output is piped."""

from __future__ import annotations

import asyncio
import os
import pty
import sys
from pathlib import Path

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


async def test_ctrl_c_erases_the_bar_then_says_so_and_exits_130(cli, sqlite_source: str) -> None:
    """Ctrl-C during a copy on a terminal: the bar is erased first, then one line, exit 130."""
    import select  # noqa: PLC0415
    import signal  # noqa: PLC0415

    args = [*cli.store_args, "copy", "--from", sqlite_source, "--to", cli.url, "--batch", "5"]
    env = {**os.environ, "COLUMNS": "160", "TERM": "xterm"}
    leader, follower = pty.openpty()
    proc = await asyncio.create_subprocess_exec(
        BIN, *args, stdin=follower, stdout=follower, stderr=follower, env=env
    )
    # The follower stays open here until the end: once every holder of it has closed,
    # Linux may drop what the child wrote last before it is read.
    seen = b""
    while b"items/s" not in seen:  # the bar is on screen
        chunk = await asyncio.to_thread(os.read, leader, 65536)
        assert chunk, seen
        seen += chunk
    proc.send_signal(signal.SIGINT)
    code = await asyncio.wait_for(proc.wait(), timeout=60)
    while select.select([leader], [], [], 0.5)[0]:  # drain what is left
        seen += os.read(leader, 65536)
    os.close(follower)
    os.close(leader)
    screen = seen.decode("utf-8", "replace")
    assert code == 130, screen
    assert "interrupted; run the same command again" in screen, repr(screen[-700:])
    notice = screen.index("interrupted; run the same command again")
    after = screen[notice:]
    assert "items/s" not in after  # nothing of the bar is drawn after the message
    erase = screen.rfind("\x1b[2K", 0, notice)  # rich erases its lines when it stops
    assert erase != -1, repr(screen[-400:])
    assert "items/s" not in screen[erase:notice]
