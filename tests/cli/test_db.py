"""``agents-memory db …``: the migrations front end, on each database."""

from __future__ import annotations

import re
import shlex

from sqlalchemy import inspect

from agents_memory import create_engine, migrations

HEAD = migrations.head()


async def test_upgrade_current_check_history(cli) -> None:
    """Upgrade creates the schema once; current, check and history report it, as text and JSON."""
    first = await cli("db", "upgrade")
    assert f"from none to {HEAD} (head)" in first.stdout
    again = await cli("db", "upgrade")
    assert "already at" in again.stdout
    assert await cli.json("db", "current") == {"revision": HEAD, "head": HEAD, "at_head": True}
    assert (await cli("db", "current")).stdout.strip() == f"{HEAD} (head)"
    assert "matches the models" in (await cli("db", "check")).stdout
    assert await cli.json("db", "check") == {"ok": True, "differences": []}
    history = await cli.json("db", "history")
    assert [r["revision"] for r in history] == [r.revision for r in migrations.history()]
    assert [r["head"] for r in history][-1] is True


async def test_downgrade_asks_then_check_reports_drift(cli) -> None:
    """Downgrade asks first; an old schema makes check exit 1 and list what differs."""
    await cli("db", "upgrade")
    refused = await cli("db", "downgrade", "0001", input="n\n", code=1)
    assert "Aborted" in refused.output
    assert (await cli.json("db", "current"))["revision"] == HEAD
    done = await cli("db", "downgrade", "0001", input="y\n")
    assert f"from {HEAD} (head) to 0001" in done.stdout
    drift = await cli("db", "check", code=1)
    assert "differs" in drift.stdout
    assert f"not at head {HEAD}" in drift.stdout
    report = await cli("db", "check", "--json", code=1)
    assert '"ok": false' in report.stdout
    await cli("db", "upgrade")
    await cli("db", "downgrade", "base", "--yes")
    assert (await cli.json("db", "current"))["revision"] is None


async def test_unknown_revision_points_at_history(cli) -> None:
    """A revision that does not exist is exit 1 with the known ones and the history command."""
    result = await cli("db", "upgrade", "9999", code=1)
    assert "cannot migrate to revision '9999'" in result.stderr
    assert "agents-memory db history" in result.stderr


async def test_schema_not_ready_names_a_command_that_works(cli, file_backend) -> None:
    """On an unmigrated database, the error's command, run as printed, fixes it."""
    if file_backend.kind == "sqlite":
        await cli("db", "upgrade")  # create the file, then remove the tables again
        await cli("db", "downgrade", "base", "--yes")
    result = await cli("sessions", "list", code=1)
    command = re.search(r"run `(agents-memory db upgrade [^`]*)`", result.stderr)
    assert command is not None, result.stderr
    args = shlex.split(command.group(1))[1:]
    assert "--sessions-table" in args
    await cli.raw(*args)
    assert (await cli.json("sessions", "list"))["sessions"] == []


async def test_swapped_names_upgrade_and_check_agree(cli, store) -> None:
    """Swapped --sessions-table/--messages-table: upgrade and check give one message, exit 1."""
    from agents_memory import TableNames  # noqa: PLC0415

    await store.session("a").add_items([{"n": 1}])
    swapped = ["--sessions-table", cli.names.messages, "--messages-table", cli.names.sessions]
    up = await cli.raw("db", "upgrade", "--url", cli.url, *swapped)
    check = await cli.raw("db", "check", "--url", cli.url, *swapped)
    assert (up.exit_code, check.exit_code) == (1, 1)
    # the same words (the list of other sets may change meanwhile: parallel runs share servers)
    assert up.stderr.split("table-name sets")[0] == check.stderr.split("table-name sets")[0]
    assert "the names look swapped: use --sessions-table" in up.stderr
    assert "nothing was changed" in up.stderr
    assert "db upgrade" not in up.stderr  # no advice that loops back here
    assert await store.session("a").get_items() == [{"n": 1}]
    engine = create_engine(cli.url)
    try:
        version = TableNames(cli.names.messages, cli.names.sessions).version_table
        async with engine.connect() as conn:
            assert not await conn.run_sync(lambda c: inspect(c).has_table(version))
    finally:
        await engine.dispose()


async def test_lock_option_picks_the_row_lock_and_refuses_other_words(cli, monkeypatch) -> None:
    """``--lock row`` makes the lock table (downgrade base drops it); a bad word is exit 2."""
    bad = await cli("db", "upgrade", "--lock", "rows", code=2)
    assert "invalid migration lock 'rows'" in bad.output
    assert "auto, advisory, row" in bad.output
    await cli("db", "upgrade", "--lock", "row")
    engine = create_engine(cli.url)
    try:
        async with engine.connect() as conn:
            made = await conn.run_sync(
                lambda c: inspect(c).has_table(cli.names.migration_lock_table)
            )
        assert made
        monkeypatch.setenv("AGENTS_MEMORY_MIGRATION_LOCK", "sometimes")
        refused = await cli("db", "downgrade", "base", "--yes", code=1)
        assert "'sometimes' (from $AGENTS_MEMORY_MIGRATION_LOCK)" in refused.stderr
        monkeypatch.delenv("AGENTS_MEMORY_MIGRATION_LOCK")
        await cli("db", "downgrade", "base", "--yes", "--lock", "row")
        async with engine.connect() as conn:
            gone = not await conn.run_sync(
                lambda c: inspect(c).has_table(cli.names.migration_lock_table)
            )
        assert gone
    finally:
        await engine.dispose()
