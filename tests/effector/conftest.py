"""Fixtures shared by the effector tests: stores by URL, a throwaway PostgreSQL, the ledger."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from effector_test_tools import LEDGER_ENV, create_ledger

from effector.store import EffectorStore, open_store
from tests.pg import PostgresServer, postgres_server


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


async def execute_sql(store_url: str, statements: Sequence[str]) -> list[Any]:
    """Run ``statements`` on a closed store's database, bypassing the store; the last one's rows.

    For tests that rewrite a store's layout (an older schema version) or read it directly.
    """
    rows: list[Any] = []
    if store_url.startswith("sqlite:///"):
        connection = sqlite3.connect(store_url.removeprefix("sqlite:///"))
        try:
            with connection:
                for statement in statements:
                    rows = connection.execute(statement).fetchall()
        finally:
            connection.close()
        return rows
    async with await psycopg.AsyncConnection.connect(store_url, autocommit=True) as connection:
        for statement in statements:
            cursor = await connection.execute(statement)
            rows = await cursor.fetchall() if cursor.description else []
    return rows


async def schema_version(store_url: str) -> str:
    """The ``schema_version`` a closed store records."""
    [(version,)] = await execute_sql(
        store_url, ["SELECT value FROM effector_meta WHERE name = 'schema_version'"]
    )
    return str(version)


VERSION_6_ONLY = [
    "DROP INDEX effector_intents_queue",
    "CREATE INDEX effector_intents_queue ON effector_intents (entity_key, seq, step_index) "
    "WHERE state IN (1, 2, 5)",
]
"""What turns a version 6 store back into the version 5 layout (its version aside)."""

VERSION_5_ONLY = [*VERSION_6_ONLY, "DROP TABLE effector_compensations"]
"""What turns a current store back into the version 4 layout (its version aside)."""

VERSION_4_ONLY = [
    *VERSION_5_ONLY,
    "DROP INDEX effector_intents_queue",
    "CREATE INDEX effector_intents_queue ON effector_intents (entity_key, seq, step_index) "
    "WHERE state IN (1, 2)",
    "ALTER TABLE effector_intents DROP COLUMN in_doubt_reason",
    "ALTER TABLE effector_intents DROP COLUMN retry_at_ms",
    "ALTER TABLE effector_intents DROP COLUMN reconcile_failures",
]
"""What turns a current store back into the version 3 layout (its version aside)."""

VERSION_3_ONLY = [
    *VERSION_4_ONLY,
    "DROP INDEX effector_intents_completed",
    "DROP INDEX effector_intents_by_tool",
    "DROP INDEX effector_intents_awaiting_by_key",
    "DROP INDEX effector_intents_by_key",
    "ALTER TABLE effector_intents DROP COLUMN started_at_ms",
    "ALTER TABLE effector_intents DROP COLUMN tool_name",
    "CREATE INDEX effector_intents_done ON effector_intents (completed_at_ms) WHERE state = 4",
    "DROP TABLE effector_traces",
    "DROP TABLE effector_errors",
    "DROP TABLE effector_key_activity",
    "DROP TABLE effector_records",
]
"""What turns a current store back into the version 2 layout (its version aside)."""


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store of each kind."""
    if request.param == "sqlite":
        return sqlite_url(tmp_path / "store.db")
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.create_database("effector")


@pytest_asyncio.fixture
async def store(store_url: str) -> AsyncIterator[EffectorStore]:
    """A fresh store of each kind, open for the test and closed after it."""
    opened = await open_store(store_url)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the test tools record their executions (also inherited by subprocesses)."""
    path = create_ledger(tmp_path / "ledger.db")
    monkeypatch.setenv(LEDGER_ENV, str(path))
    return path
