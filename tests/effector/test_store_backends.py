"""Backend specifics: store URLs, the schema version check, SQLite's single-process lock."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import psycopg
import pytest
from conftest import sqlite_url
from effector_harness import make_intent

from effector.store import open_store
from effector.store.errors import ConfigurationError, StoreBusyError, StoreSchemaError
from effector.store.intents import NewIntent, SubmitOutcome
from effector.store.sqlite import parse_sqlite_url


def test_sqlite_urls() -> None:
    assert parse_sqlite_url("sqlite:///relative.db") == (Path("relative.db"), "full")
    assert parse_sqlite_url("sqlite:////abs/x.db?synchronous=NORMAL") == (
        Path("/abs/x.db"),
        "normal",
    )
    for bad, message in [
        ("sqlite://x.db", "starts with"),
        ("sqlite:///", "file path"),
        ("sqlite:///:memory:", "in-memory"),
        ("sqlite:///x.db?journal=off", "unknown SQLite store option"),
        ("sqlite:///x.db?synchronous=off", "synchronous must be one of"),
    ]:
        with pytest.raises(ConfigurationError, match=message):
            parse_sqlite_url(bad)


@pytest.mark.asyncio
async def test_unknown_scheme_is_a_configuration_error_without_echoing_the_url() -> None:
    with pytest.raises(ConfigurationError) as raised:
        await open_store("mysql://user:hunter2@db/x")
    assert "hunter2" not in str(raised.value)


@pytest.mark.asyncio
async def test_a_sqlite_store_admits_one_process_at_a_time(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "s.db")
    first = await open_store(url)
    try:
        with pytest.raises(StoreBusyError, match="in use"):
            await open_store(url)
    finally:
        await first.close()
    second = await open_store(url)
    await second.close()


def _set_schema_version(store_url: str, version: str) -> None:
    if store_url.startswith("sqlite"):
        connection = sqlite3.connect(parse_sqlite_url(store_url)[0])
        with connection:
            connection.execute(
                "UPDATE effector_meta SET value = ? WHERE name = 'schema_version'", (version,)
            )
        connection.close()
    else:
        with psycopg.connect(store_url, autocommit=True) as pg:
            pg.execute(
                "UPDATE effector_meta SET value = %s WHERE name = 'schema_version'", (version,)
            )


@pytest.mark.asyncio
async def test_an_unknown_schema_version_is_refused(store_url: str) -> None:
    store = await open_store(store_url)
    await store.close()
    _set_schema_version(store_url, "99")
    with pytest.raises(StoreSchemaError, match="schema version 99"):
        await open_store(store_url)


@pytest.mark.asyncio
async def test_sqlite_reads_answer_while_a_write_transaction_is_open(tmp_path: Path) -> None:
    store = await open_store(sqlite_url(tmp_path / "s.db"))
    release = threading.Event()
    intent = make_intent("record", {"event": "e"})
    try:
        (recorded,) = await store.submit([NewIntent(intent, None)], now_ms=1_000)
        assert recorded.outcome is SubmitOutcome.ACCEPTED
        # Hold the writer inside a transaction until the reads are done: they must not need it.
        writer = asyncio.ensure_future(store._run(lambda tx: release.wait(30), write=True))
        try:
            counts = await asyncio.wait_for(store.counts(), 10)
            seen = await asyncio.wait_for(store.get_intent(intent.intent_id), 10)
            assert not writer.done()
        finally:
            release.set()
            assert await writer is True
    finally:
        await store.close()
    assert counts.pending == 1
    assert seen is not None and seen.intent == intent
