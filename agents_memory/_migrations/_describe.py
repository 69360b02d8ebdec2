"""Alembic's schema differences as sentences a person reads (``db check``).

``compare_metadata`` returns tuples holding SQLAlchemy objects; printed as they
are, they read ``('remove_column', None, 'agent_messages', Column(… <TextClause
object at 0x…>``. Each kind gets a sentence naming the table, the column and
what the database has against what this version expects.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.engine import Dialect


def _type(value: Any, dialect: Dialect) -> str:  # noqa: ANN401
    try:
        return str(value.compile(dialect=dialect))
    except Exception:  # noqa: BLE001 - a type this dialect cannot render: its Python repr
        return repr(value)


def _default(value: Any) -> str:  # noqa: ANN401
    if value is None:
        return "none"
    text = getattr(value, "text", None) or getattr(getattr(value, "arg", None), "text", None)
    return str(text) if text is not None else str(getattr(value, "arg", value))


def _columns(obj: Any) -> str:  # noqa: ANN401
    return ", ".join(str(c.name) for c in getattr(obj, "columns", ()))


def describe_difference(diff: Any, dialect: Dialect) -> str:  # noqa: ANN401
    """One sentence for one difference (a list of column changes: one sentence each, joined)."""
    if isinstance(diff, list):
        return "; ".join(describe_difference(d, dialect) for d in diff)
    kind = diff[0]
    if kind.startswith("modify_"):
        return _modified(diff, dialect)
    return _added_or_removed(diff)


def _added_or_removed(diff: Any) -> str:  # noqa: ANN401, PLR0911 - one return per kind
    kind = diff[0]
    if kind in {"add_table", "remove_table"}:
        state = "is missing" if kind == "add_table" else "exists but is not expected"
        return f"table {diff[1].name} {state}"
    if kind in {"add_column", "remove_column"}:
        table, column = diff[2], diff[3]
        if kind == "add_column":
            return f"column {table}.{column.name} is missing"
        return f"column {table}.{column.name} exists but this version's schema has no such column"
    if kind in {"add_index", "remove_index"}:
        index = diff[1]
        where = f"index {index.name} on {index.table.name} ({_columns(index)})"
        return f"{where} is missing" if kind == "add_index" else f"{where} is not expected"
    if kind in {"add_fk", "remove_fk"}:
        fk = diff[1]
        name = f"foreign key {fk.name} " if fk.name else "a foreign key "
        where = f"{name}on {fk.parent.name} ({_columns(fk)})"
        return f"{where} is missing" if kind == "add_fk" else f"{where} is not expected"
    if kind in {"add_constraint", "remove_constraint"}:
        constraint = diff[1]
        table = getattr(getattr(constraint, "table", None), "name", "?")
        where = f"constraint {constraint.name} on {table} ({_columns(constraint)})"
        return f"{where} is missing" if kind == "add_constraint" else f"{where} is not expected"
    return f"{kind.replace('_', ' ')}: " + ", ".join(str(part) for part in diff[1:])


def _modified(diff: Any, dialect: Dialect) -> str:  # noqa: ANN401
    kind, _schema, table, column, _kw, has, wants = diff
    column_name = f"column {table}.{column}"
    if kind == "modify_type":
        return (
            f"{column_name} is {_type(has, dialect)} in the database, "
            f"{_type(wants, dialect)} expected"
        )
    if kind == "modify_nullable":
        now = "allows NULL" if has else "does not allow NULL"
        return f"{column_name} {now}; it {'should' if wants else 'should not'}"
    if kind == "modify_default":
        return (
            f"{column_name} defaults to {_default(has)} in the database, {_default(wants)} expected"
        )
    return f"{column_name}: {kind.removeprefix('modify_')} is {has!r}, {wants!r} expected"
