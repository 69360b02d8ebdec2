"""Alembic environment for agents_memory: ``alembic upgrade head`` from the repository root.

URL: ``-x url=…``, else ``$AGENTS_MEMORY_URL``, else ``sqlite+aiosqlite:///./agents_memory.db``.
Tables: ``-x sessions_table=… -x messages_table=…``, else ``$AGENTS_MEMORY_SESSIONS_TABLE`` /
``$AGENTS_MEMORY_MESSAGES_TABLE``, else ``agent_sessions`` / ``agent_messages``.
"""

from logging.config import fileConfig

from agents_memory._migrations._env import run
from alembic import context

# alembic.ini's logging: Alembic's "Running upgrade …" lines and ours (database, revisions).
if context.config.config_file_name is not None:
    fileConfig(context.config.config_file_name, disable_existing_loggers=False)

run(context)
