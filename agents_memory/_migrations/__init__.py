"""The migration engine: where the scripts are, and the Alembic environment they run in.

Three front ends share it: :mod:`agents_memory.migrations` (programmatic),
``agents-memory db …`` (CLI) and plain ``alembic`` from the repository root.
"""
