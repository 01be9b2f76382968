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

from effector.store import open_store
from effector.store.sql import SqlStore
from tests.pg import PostgresServer, postgres_server


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


async def execute_sql(store_url: str, statements: Sequence[str]) -> list[Any]:
    """Run ``statements`` on a closed store's database, bypassing the store; the last one's rows.

    For tests that change a store's tables or read them directly.
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


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store of each kind."""
    if request.param == "sqlite":
        return sqlite_url(tmp_path / "store.db")
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.create_database("effector")


@pytest_asyncio.fixture
async def store(store_url: str) -> AsyncIterator[SqlStore]:
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
