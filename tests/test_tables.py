"""Table-name validation and derived names: written once, in agents_memory._tables."""

from __future__ import annotations

import pytest

from agents_memory import TableNames


def test_defaults_match_the_seed() -> None:
    """The default pair and index name are the seed's."""
    names = TableNames()
    assert (names.sessions, names.messages) == ("agent_sessions", "agent_messages")
    assert names.messages_index == "idx_agent_messages_session_id"


def test_version_table_is_per_set_and_bounded() -> None:
    """Each set has its own version table, never alembic_version, at most 63 characters."""
    a, b = TableNames("a_s", "a_m"), TableNames("b_s", "b_m")
    assert a.version_table != b.version_table
    assert "alembic_version" not in (a.version_table, b.version_table)
    long_a = TableNames("s" * 63, "m")
    long_b = TableNames("s" * 62 + "t", "m")
    assert len(long_a.version_table) <= 63
    assert long_a.version_table != long_b.version_table


@pytest.mark.parametrize("bad", ["", "1x", "a-b", "a b", "a;b", "ü", "x" * 64, "a\x00"])
def test_invalid_names_are_value_errors(bad: str) -> None:
    """Anything but an unquoted identifier of at most 63 characters is refused."""
    with pytest.raises(ValueError, match="table name"):
        TableNames(sessions=bad)


def test_same_name_twice_is_refused() -> None:
    """The two tables must differ."""
    with pytest.raises(ValueError, match="differ"):
        TableNames("x", "X")
