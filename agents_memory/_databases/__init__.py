"""One module per database (``sqlite``, ``postgres``, ``mysql``) behind one interface (``base``).

``database_for(dialect_name)`` picks the module; nothing outside this package
asks which database it is on.
"""

from agents_memory._databases.base import Database, database_for

__all__ = ["Database", "database_for"]
