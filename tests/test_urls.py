"""URL normalisation and masking: one rule, used everywhere."""

from __future__ import annotations

import pytest
from sqlalchemy.engine import make_url

from agents_memory import UnsupportedDatabaseError, mask_url, normalize_url


@pytest.mark.parametrize(
    ("given", "driver"),
    [
        ("sqlite:///x.db", "sqlite+aiosqlite"),
        ("sqlite://", "sqlite+aiosqlite"),
        ("sqlite+aiosqlite:///x.db", "sqlite+aiosqlite"),
        ("postgresql://u@h/db", "postgresql+asyncpg"),
        ("postgres://u@h/db", "postgresql+asyncpg"),
        ("postgresql+asyncpg://u@h/db", "postgresql+asyncpg"),
        ("mysql://u@h/db", "mysql+asyncmy"),
        ("mysql+asyncmy://u@h/db", "mysql+asyncmy"),
        ("mysql+aiomysql://u@h/db", "mysql+asyncmy"),
        ("mariadb://u@h/db", "mariadb+asyncmy"),
        ("mariadb+aiomysql://u@h/db", "mariadb+asyncmy"),
    ],
)
def test_plain_urls_map_to_async_drivers(given: str, driver: str) -> None:
    """Plain URLs get the async driver; database, host and user are kept."""
    url = normalize_url(given)
    assert url.drivername == driver
    assert url.database == make_url(given).database
    assert url.host == make_url(given).host


@pytest.mark.parametrize(
    "given",
    [
        "oracle://u@h/db",
        "postgresql+psycopg2://u@h/db",
        "sqlite+pysqlite:///x",
        "mysql+pymysql://u@h/db",
        "nope",
    ],
)
def test_unsupported_urls_name_the_supported_ones(given: str) -> None:
    """Unsupported databases or drivers get an error that lists what works."""
    with pytest.raises(UnsupportedDatabaseError) as info:
        normalize_url(given)
    assert any(d in str(info.value) for d in ("asyncpg", "aiosqlite", "asyncmy"))


def test_password_is_masked_in_errors_and_display() -> None:
    """A password never appears in a masked URL or in an unsupported-URL error."""
    assert "s3cret" not in mask_url("postgresql://bob:s3cret@db.example.com/app")
    assert "bob" in mask_url("postgresql://bob:s3cret@db.example.com/app")
    assert "s3cret" not in mask_url("garbage://bob:s3cret@::::")
    with pytest.raises(UnsupportedDatabaseError) as info:
        normalize_url("oracle://bob:s3cret@db/x")
    assert "s3cret" not in str(info.value)


def test_mysql_urls_talk_utf8mb4() -> None:
    """MySQL/MariaDB URLs get charset=utf8mb4 (4-byte characters) unless they name a charset."""
    assert normalize_url("mysql://u@h/db").query["charset"] == "utf8mb4"
    assert normalize_url("mariadb://u:pw@h:3307/db").query["charset"] == "utf8mb4"
    assert normalize_url("mysql://u@h/db?charset=UTF8MB4").query["charset"] == "UTF8MB4"
    assert "pw" not in mask_url(normalize_url("mariadb://u:pw@h/db"))


@pytest.mark.parametrize("charset", ["utf8", "utf8mb3", "latin1"])
def test_mysql_charsets_other_than_utf8mb4_are_refused(charset: str) -> None:
    """A MySQL URL with a charset that cannot hold emoji is refused, naming the fix."""
    with pytest.raises(UnsupportedDatabaseError) as info:
        normalize_url(f"mysql://u:pw@h/db?charset={charset}")
    message = str(info.value)
    assert f"charset={charset}" in message
    assert "use charset=utf8mb4" in message
    assert "pw@" not in message


@pytest.mark.parametrize("key", ["password", "passwd", "sslpassword"])
def test_a_password_in_the_query_is_masked(key: str) -> None:
    """``?password=…`` is hidden wherever ``user:pw@`` is: masked URLs, unsupported-URL errors."""
    url = f"postgresql://bob@db.example.com/app?sslmode=disable&{key}=s3cret"
    masked = mask_url(url)
    assert "s3cret" not in masked
    assert f"{key}=***" in masked
    assert "sslmode=disable" in masked
    assert "s3cret" not in mask_url(normalize_url(url))
    with pytest.raises(UnsupportedDatabaseError) as info:
        normalize_url(f"oracle://bob@db/x?{key}=s3cret")
    assert "s3cret" not in str(info.value)


def test_text_that_is_not_a_url_is_shown_as_typed() -> None:
    """`--url notaurl` holds no credentials: the error shows it so the typo can be seen."""
    with pytest.raises(UnsupportedDatabaseError) as info:
        normalize_url("notaurl")
    assert "notaurl" in str(info.value)
