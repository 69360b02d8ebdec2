"""ORM models per table-name set: cached, and every name derived from the set."""

from __future__ import annotations

from sqlalchemy import ForeignKeyConstraint, PrimaryKeyConstraint

from agents_memory import TableNames, get_models
from agents_memory import models as default_models


def test_factory_is_cached_per_name_set() -> None:
    """The same names give the same classes; other names give other classes."""
    a = get_models(TableNames("x_s", "x_m"))
    assert a is get_models(TableNames("x_s", "x_m"))
    b = get_models(TableNames("y_s", "y_m"))
    assert a.Session is not b.Session
    assert a.metadata is not b.metadata
    assert get_models() is get_models(TableNames())
    assert default_models.Session is get_models().Session


def test_every_name_derives_from_the_set() -> None:
    """Tables, foreign key, primary keys and index are named from the chosen tables."""
    names = TableNames("chat_sessions", "chat_items")
    m = get_models(names)
    messages = m.metadata.tables["chat_items"]
    sessions = m.metadata.tables["chat_sessions"]
    (fk,) = [c for c in messages.constraints if isinstance(c, ForeignKeyConstraint)]
    assert fk.referred_table is sessions
    assert fk.name == "fk_chat_items_session_id_chat_sessions"
    assert fk.ondelete == "CASCADE"
    pks = [
        c.name
        for c in (*messages.constraints, *sessions.constraints)
        if isinstance(c, PrimaryKeyConstraint)
    ]
    assert sorted(pks) == ["pk_chat_items", "pk_chat_sessions"]
    assert messages.indexes == set()  # the primary key (session_id, position) serves every read
    assert [c.name for c in messages.primary_key.columns] == ["session_id", "position"]
    structure = m.metadata.tables[names.structure]
    derived = names.derived_names()
    assert {i.name for i in structure.indexes} == {
        derived["structure_turn_index"],
        derived["structure_item_index"],
    }
    (item_fk,) = [
        c
        for c in structure.constraints
        if isinstance(c, ForeignKeyConstraint) and c.referred_table is messages
    ]
    assert item_fk.name == derived["structure_item_fk"]
    assert [c.name for c in item_fk.columns] == ["session_id", "message_position"]


def test_models_are_usable_with_the_orm() -> None:
    """The classes are real mapped classes with a relationship between them."""
    m = get_models(TableNames("orm_s", "orm_m"))
    session = m.Session(session_id="a")
    session.messages.append(m.Message(message_data="{}"))
    assert session.messages[0].session is session
