"""Shared pieces of the reliability suite: the scale knob, the ledger, and subjects under test.

Every test here is marked ``reliability`` (``pytest -m reliability`` runs them alone)
and also runs in the normal suite. Repetition counts are multiplied by
``AGENTS_MEMORY_RELIABILITY_SCALE`` (default 1: small but meaningful; the report
runs with more). Each test records what it tried in the ledger; with
``AGENTS_MEMORY_RELIABILITY_JSON`` set, the records of a run are written there for
``tests/reliability/report.py`` to turn into RELIABILITY.md.

A backend added to the root ``backend`` fixture is picked up by every test that
takes ``store`` or ``file_backend``; :func:`open_store` is the one place that
maps a backend to an object with ``.session(id)``, for tests that run their own
event loop or child processes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

import pytest
from _support import JSON_OUT, SCALE, Ledger, Record

_ALL: list[Record] = []
_LEDGER = pytest.StashKey[Ledger]()
_FAILED = pytest.StashKey[bool]()


@pytest.fixture
def ledger(request: pytest.FixtureRequest) -> Ledger:
    """Where a test writes its figures (backend taken from the ``backend`` fixture if used)."""
    backend = "-"
    if "backend" in request.fixturenames:
        backend = request.getfixturevalue("backend").id
    book = Ledger(request.node.nodeid, backend)
    request.node.stash[_LEDGER] = book
    return book


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Iterator[pytest.TestReport]:
    """Attach each test's outcome to its records once the test (and its fixtures) finished."""
    report: pytest.TestReport = yield
    book = item.stash.get(_LEDGER, None)
    if report.when == "teardown" and book is not None:
        failed = item.stash.get(_FAILED, False)
        for record in book.records:
            record.outcome = "failed" if failed else "passed"
            _ALL.append(record)
    if report.failed:
        item.stash[_FAILED] = True
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Write the collected records as JSON when the report script asked for them."""
    if JSON_OUT:
        payload = {"scale": SCALE, "records": [asdict(r) for r in _ALL]}
        Path(JSON_OUT).write_text(json.dumps(payload, indent=1), encoding="utf-8")
