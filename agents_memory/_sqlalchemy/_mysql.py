"""MySQL/MariaDB's per-statement size limit, checked before an append is sent.

A statement larger than the server's ``max_allowed_packet`` makes the server
drop the connection, which the driver reports as "Lost connection to MySQL
server": nothing says the item was too large, or what to change. Checking the
encoded items first turns that into a ``ValueError`` that names the limit.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection

STATEMENT_OVERHEAD = 4096
"""Room for the SQL around one row (statement text, session id, protocol header)."""


async def max_packet(conn: AsyncConnection) -> int:
    """The server's ``max_allowed_packet`` in bytes, as this connection sees it."""
    return int((await conn.execute(text("SELECT @@max_allowed_packet"))).scalar_one())


def check_packet_size(data: Sequence[str], limit: int) -> None:
    """Raise ``ValueError`` if an encoded item cannot fit in one statement under ``limit``.

    The driver escapes quotes and backslashes, so those count twice. A cheap
    bound (4 bytes a character) skips the exact count for all ordinary items.
    """
    room = limit - STATEMENT_OVERHEAD
    for index, item in enumerate(data):
        if len(item) * 8 <= room:
            continue
        size = len(item.encode("utf-8")) + item.count('"') + item.count("\\") + item.count("'")
        if size > room:
            msg = (
                f"item {index} is {size} bytes as sent, more than this MySQL/MariaDB server "
                f"accepts in one statement (max_allowed_packet = {limit}); raise "
                "max_allowed_packet on the server (e.g. SET GLOBAL max_allowed_packet = "
                "1073741824, and in its config file) or store smaller items"
            )
            raise ValueError(msg)
