"""Sessions for tests (one per database), lint, type checks and benchmarks.

Reads Python versions and extras from pyproject.toml; the database is a
parameter: ``nox -s "tests(db='postgres')"``. Plain ``nox`` runs everything, including
the suite through PgBouncer in transaction pooling mode (``db='pgbouncer'``; start it
with ``bash .ci/pgbouncer``), on Postgres with hash-partitioned messages tables
(``db='postgres-partitioned'``) and the sqlite suite on the newest Python listed
(``newest_python``).
"""

from __future__ import annotations

import sys

import nox

PYPROJECT = nox.project.load_toml("pyproject.toml")
SUPPORTED = nox.project.python_versions(PYPROJECT)
CURRENT = f"{sys.version_info.major}.{sys.version_info.minor}"
PYTHON = CURRENT if CURRENT in SUPPORTED else SUPPORTED[0]
NEWEST = SUPPORTED[-1]
DATABASES = ["sqlite", "postgres", "mysql", "pgbouncer", "postgres-partitioned"]
PARTITIONED = {"postgres-partitioned": ("postgres", "8")}
"""A layout, not a server: the Postgres suite with every migrated messages table built
hash-partitioned into 8 partitions ($AGENTS_MEMORY_PARTITIONS, read by the migrations)."""

nox.options.sessions = ["lint", "typecheck", "tests", "newest_python"]
nox.options.reuse_existing_virtualenvs = True


@nox.session(python=PYTHON)
@nox.parametrize("db", DATABASES)
def tests(session: nox.Session, db: str) -> None:
    """Run the suite against the built package (not the source tree) on one database.

    The tests that take no database run in the sqlite session only (tests/conftest.py
    deselects them when sqlite is not selected): they reach no server, so once is enough.
    """
    _suite(session, *PARTITIONED.get(db, (db,)))


@nox.session(python=NEWEST)
def newest_python(session: nox.Session) -> None:
    """The sqlite suite (and every test that takes no database) on the newest Python listed.

    ``tests`` runs on the Python nox runs on; this keeps the newest classifier in
    pyproject.toml a tested claim (its ``asyncio`` and ``sqlite3`` change between releases).
    Without that interpreter nox skips this session, or fails it when ``CI`` is set.
    """
    if NEWEST == PYTHON:
        session.skip(f"tests(db='sqlite') runs on Python {NEWEST} already")
    _suite(session, "sqlite")


def _suite(session: nox.Session, server: str, partitions: str = "0") -> None:
    """The suite, installed from the built package, with one server selected.

    Spread over one pytest-xdist worker per CPU (``-n auto``): the suite is mostly CPU
    work in the test process, so two CPUs run it in a little over half the time. Arguments
    after ``--`` replace these (``-- tests/cli -x`` runs serially).
    """
    session.install(".[test]")
    session.run(
        "pytest",
        *(session.posargs or ["tests", "-n", "auto", "--dist", "worksteal"]),
        env={"AGENTS_MEMORY_TEST_DB": server, "AGENTS_MEMORY_PARTITIONS": partitions},
    )


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """Ruff lint and format check."""
    session.install("ruff")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """Type-check the package and the user-side typing tests with mypy --strict."""
    session.install(".[test]", "mypy")
    session.run("mypy")


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks against the raw drivers and the Agents SDK's stores (``-- --quick``: short)."""
    session.install(".[test]")
    session.run("python", "-m", "benchmarks", *session.posargs)
