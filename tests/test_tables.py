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


def test_version_table_keeps_its_name_while_its_key_fits() -> None:
    """Existing lineages keep `<sessions>_version` as long as Alembic's `_pkc` key fits in 63."""
    for length in (1, 14, 51):
        sessions = "s" * length
        names = TableNames(sessions, "m")
        assert names.version_table == f"{sessions}_version"
        assert len(f"{names.version_table}_pkc") <= 63
        assert names.legacy_version_table is None
    assert TableNames().version_table == "agent_sessions_version"
    assert TableNames("Chat_Sessions", "Chat_Messages").version_table == "Chat_Sessions_version"


@pytest.mark.parametrize("length", range(52, 64))
def test_long_sessions_names_get_a_short_stable_version_table(length: int) -> None:
    """Past 51 characters the version table is hashed down to 59, so Alembic's key fits.

    The old name (which only SQLite, and MariaDB at 52, could create) is the legacy name.
    """
    sessions = "s" * (length - 1) + "t"
    names = TableNames(sessions, "m")
    derived = names.derived_names()
    assert len(names.version_table) <= 59
    assert derived["version_table_pk"] == f"{names.version_table}_pkc"
    assert len(derived["version_table_pk"]) <= 63
    assert names.version_table == TableNames(sessions, "other").version_table  # stable
    assert names.version_table != TableNames("s" * length, "m").version_table
    assert names.version_table.startswith(sessions[:42])
    assert names.legacy_version_table is not None
    assert names.legacy_version_table != names.version_table


@pytest.mark.parametrize("database", ["postgresql", "mysql", "mariadb", "sqlite"])
def test_longest_names_fit_every_database(database: str) -> None:
    """Two 63-character names are accepted, and every derived name fits the database."""
    names = TableNames("S" * 63, "m" * 63)
    limit = {"postgresql": 63, "mysql": 64, "mariadb": 64}.get(database)
    for role, name in names.derived_names(database).items():
        if limit is not None:
            assert len(name) <= limit, role
        elif role.endswith("_rebuild"):
            assert name.startswith("_alembic_tmp_")


def test_derived_names_rejects_an_unknown_database() -> None:
    with pytest.raises(ValueError, match="unknown database"):
        TableNames().derived_names("oracle")


def test_too_long_derived_name_is_refused_naming_the_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A derived name past the limit is refused at construction, naming the limit.

    The version-table rule keeps every name in bounds, so the guard is shown with
    the rule earlier releases had (`<sessions>_version` whenever it fit in 63).
    """
    from agents_memory import _tables  # noqa: PLC0415

    monkeypatch.setattr(_tables, "version_table_for", lambda s: f"{s}_version")
    _tables._refusal.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"limit of 63.*fit in 63") as info:
            TableNames("s" * 52, "m")
        assert "version table's primary key" in str(info.value)
        assert f"'{'s' * 52}_version_pkc'" in str(info.value)
        TableNames("s" * 51, "m")  # 51 + _version_pkc is exactly 63
    finally:
        _tables._refusal.cache_clear()


@pytest.mark.parametrize(
    ("pair", "what"),
    [
        (("s", "pk_s"), "messages table and the sessions table's primary key"),
        (("s", "PK_S"), "messages table and the sessions table's primary key"),
        (("s", "idx_s_updated_at"), "messages table and the sessions index on updated_at"),
        (("pk_m", "m"), "sessions table and the messages table's primary key"),
        (("idx_m_session_id", "m"), "sessions table and the messages index"),
        (("pk_a", "a_version"), "version table and the messages table's primary key"),
        (("s", "_alembic_tmp_s"), "messages table and the copy Alembic rebuilds"),
    ],
)
def test_collisions_with_derived_names_are_refused(pair: tuple[str, str], what: str) -> None:
    """A table may not share a name (case-insensitively) with anything else the set makes."""
    with pytest.raises(ValueError, match="collide") as info:
        TableNames(*pair)
    message = str(info.value)
    assert what in message
    assert "case-insensitively" in message


@pytest.mark.parametrize(
    "pair",
    [("agent_sessions", "agent_sessions_version"), ("x", "X_VERSION"), ("Chat", "chat_version")],
)
def test_a_messages_table_named_as_the_version_table_is_refused_as_such(
    pair: tuple[str, str],
) -> None:
    """``<sessions>_version`` as the messages table: the message says it is the version table."""
    with pytest.raises(ValueError, match="is the name of the version table") as info:
        TableNames(*pair)
    assert f"messages table {pair[1]!r}" in str(info.value)
    assert f"sessions table {pair[0]!r}" in str(info.value)


def test_case_insensitive_duplicates_are_refused() -> None:
    """Tables that differ only in case are one table on SQLite."""
    with pytest.raises(ValueError, match="case-insensitively"):
        TableNames("Chat_Sessions", "chat_sessions")


@pytest.mark.parametrize("bad", ["sqlite_sessions", "SQLite_Stat", "sqlite_"])
def test_sqlite_reserved_prefix_is_refused(bad: str) -> None:
    """SQLite will not create a table whose name starts with sqlite_."""
    with pytest.raises(ValueError, match="SQLite reserves"):
        TableNames(sessions=bad)
    with pytest.raises(ValueError, match="SQLite reserves"):
        TableNames(messages=bad)


@pytest.mark.parametrize(
    "pair",
    [
        ("Chat_Sessions", "Chat_Messages"),
        ("user", "order"),
        ("select", "group"),
        ("KEY", "Values"),
        ("s" * 63, "m" * 63),
        ("x", "x_versions"),
        ("_", "__"),
    ],
)
def test_pairs_that_work_everywhere_are_accepted(pair: tuple[str, str]) -> None:
    """Mixed case, reserved words and the longest names are all accepted."""
    names = TableNames(*pair)
    assert (names.sessions, names.messages) == pair


def test_too_long_table_name_message_names_the_limit() -> None:
    with pytest.raises(ValueError, match=r"at most 63 characters \(Postgres' identifier limit\)"):
        TableNames(messages="m" * 64)
