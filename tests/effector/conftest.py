"""Fixtures shared by the effector tests: stores by URL, a throwaway PostgreSQL, the ledger."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from effector_test_tools import LEDGER_ENV, create_ledger

from tests.pg import PostgresServer, postgres_server


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    with postgres_server() as server:
        yield server


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store of each kind."""
    if request.param == "sqlite":
        return sqlite_url(tmp_path / "store.db")
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.create_database("effector")


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the test tools record their executions (also inherited by subprocesses)."""
    path = create_ledger(tmp_path / "ledger.db")
    monkeypatch.setenv(LEDGER_ENV, str(path))
    return path
