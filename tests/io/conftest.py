"""Fixtures for the io tests: a real effector on 127.0.0.1 in a thread, a ledger of executions."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

# The effector's test harness and tools live beside its tests and import each other as
# top-level modules (as pytest imports them there); make them importable from here too.
_EFFECTOR_TESTS = str(Path(__file__).resolve().parent.parent / "effector")
if _EFFECTOR_TESTS not in sys.path:
    sys.path.insert(0, _EFFECTOR_TESTS)

import pytest  # noqa: E402
from effector_harness import BackgroundEffector  # noqa: E402
from effector_test_tools import LEDGER_ENV, create_ledger  # noqa: E402


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the effector's test tools record their executions."""
    path = create_ledger(tmp_path / "ledger.db")
    monkeypatch.setenv(LEDGER_ENV, str(path))
    return path


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    """A fresh SQLite store."""
    return f"sqlite:///{tmp_path / 'effector.db'}"


@pytest.fixture
def effector(store_url: str, ledger: Path) -> Iterator[BackgroundEffector]:
    """A running effector on a fresh store, executing the effector tests' tools."""
    with BackgroundEffector(store_url) as running:
        yield running
