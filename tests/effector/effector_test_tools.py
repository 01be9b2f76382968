"""Tools the effector tests execute, and the ledger they record every execution in.

The ledger is a SQLite file named by the ``EFFECTOR_TEST_LEDGER`` environment variable, so
tools record the same way inside the test process and inside an effector subprocess started
through the CLI. Each execution writes a ``started`` row before doing anything and a
``finished`` row after, which is what lets the crash test tell an intent that was executing
when the server was killed from one that had not started.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from beam_agents.tools import IntentInfo, ToolRegistry, tool

LEDGER_ENV = "EFFECTOR_TEST_LEDGER"


@dataclass(frozen=True)
class LedgerRow:
    event: str
    intent_id: str
    entity_key: bytes
    seq: int
    step_index: int
    attempt: int
    tool: str
    at_ns: int
    pid: int


def _ledger() -> str | None:
    # Read once per execution: a thread abandoned by a timeout in one test must keep writing
    # to that test's ledger, not to whichever test set the variable since.
    return os.environ.get(LEDGER_ENV)


def create_ledger(path: Path) -> Path:
    """Create an empty ledger at ``path``, before any tool runs, and return the path.

    Created up front because switching a SQLite file to WAL while other connections open it
    fails at once with "database is locked" (concurrent tools would race to do it).
    """
    with sqlite3.connect(path, isolation_level=None) as connection:
        # WAL without fsync: the ledger must survive a SIGKILL of the effector, not power loss.
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute(
            "CREATE TABLE ledger (event TEXT, intent_id TEXT, entity_key BLOB, seq INTEGER, "
            "step_index INTEGER, attempt INTEGER, tool TEXT, at_ns INTEGER, pid INTEGER)"
        )
    connection.close()
    return path


def _write(path: str | None, event: str, tool_name: str, intent: IntentInfo) -> None:
    if not path:
        return
    with sqlite3.connect(path, timeout=30, isolation_level=None) as connection:
        connection.execute("PRAGMA synchronous=OFF")
        connection.execute(
            "INSERT INTO ledger VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                event,
                intent.intent_id,
                intent.entity_key,
                intent.seq,
                intent.step_index,
                intent.attempt,
                tool_name,
                time.monotonic_ns(),
                os.getpid(),
            ),
        )
    connection.close()


def read_ledger(path: Path) -> list[LedgerRow]:
    with sqlite3.connect(path, timeout=30) as connection:
        rows = connection.execute("SELECT * FROM ledger ORDER BY rowid").fetchall()
    connection.close()
    return [LedgerRow(*row) for row in rows]


@tool(side_effect=True)
def record(note: str, *, intent: IntentInfo) -> dict[str, object]:
    """Record an execution in the ledger and echo what the tool was given."""
    ledger = _ledger()
    _write(ledger, "started", "record", intent)
    _write(ledger, "finished", "record", intent)
    return {"note": note, "intent_id": intent.intent_id, "attempt": intent.attempt}


@tool(side_effect=True)
def slow(seconds: float, *, intent: IntentInfo) -> str:
    """Sleep, with ledger rows before and after; used for ordering, concurrency and crashes."""
    ledger = _ledger()
    _write(ledger, "started", "slow", intent)
    time.sleep(seconds)
    _write(ledger, "finished", "slow", intent)
    return f"slept {seconds}"


@tool(side_effect=True)
def gate(path: str, *, intent: IntentInfo) -> str:
    """Block until the file at ``path`` exists (the test opens the gate), at most 30 s."""
    ledger = _ledger()
    _write(ledger, "started", "gate", intent)
    deadline = time.monotonic() + 30
    while not Path(path).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {path} was never opened")
        time.sleep(0.01)
    _write(ledger, "finished", "gate", intent)
    return "opened"


@tool(side_effect=True)
async def async_slow(seconds: float, *, intent: IntentInfo) -> str:
    """An async tool: sleep on the event loop, with ledger rows before and after."""
    ledger = _ledger()
    _write(ledger, "started", "async_slow", intent)
    await asyncio.sleep(seconds)
    _write(ledger, "finished", "async_slow", intent)
    return f"slept {seconds}"


@tool(side_effect=True)
def add(a: int, b: int = 1) -> int:
    """Add two integers (arguments are validated and coerced)."""
    return a + b


@tool(side_effect=True)
def fail(message: str) -> None:
    """Raise, so the result is ERROR."""
    raise RuntimeError(message)


@tool(side_effect=True)
def not_json() -> object:
    """Return a value canonical JSON cannot encode."""
    return {1, 2, 3}


@tool(side_effect=True)
def huge(size: int) -> str:
    """Return a string of ``size`` characters."""
    return "x" * size


@tool(side_effect=True)
def exits() -> None:
    """Call sys.exit, which must fail the tool and not the effector."""
    sys.exit(3)


@tool(side_effect=True)
def noop() -> None:
    """Do nothing (benchmarks and dedup tests)."""


@tool
def lookup(name: str) -> str:
    """A read-only tool: the effector must refuse to run it."""
    return name.upper()


def make_registry() -> ToolRegistry:
    """A fresh registry of every tool above."""
    return ToolRegistry(
        [record, slow, gate, async_slow, add, fail, not_json, huge, exits, noop, lookup]
    )
