"""Tools for the fraud-triage example: a read-only risk lookup and a side-effecting freeze.

The effector loads ``make_effector_registry`` (``--tools fraud_tools:make_effector_registry``);
the pipeline gets ``make_pipeline_registry``: the read-only lookup, which ``ctx.run_tool`` runs
inline, and the freeze, which the pipeline never runs but which lets ``ctx.act`` check a
freeze's name and arguments when it stages one.

``freeze_account`` writes to a SQLite "bank ledger" named by ``FRAUD_LEDGER``. It records every
raw invocation, and passes the intent id as an idempotency key into the ledger, so even the one
crash window the effector cannot close (after the tool ran, before its result was recorded)
never freezes an account twice. ``make_effector_registry`` creates the ledger once, when the
effector loads the tools, because switching a new SQLite file to WAL while other connections
open it fails at once with "database is locked": freezes running side by side would race.
"""

from __future__ import annotations

import os
import sqlite3
import zlib
from contextlib import closing

from beam_agents import IntentInfo, ToolRegistry, tool

LEDGER_ENV = "FRAUD_LEDGER"


@tool
def risk_lookup(account: str) -> str:
    """Look up an account's risk band ("low", "medium" or "high"); read-only.

    Args:
        account: The account identifier, e.g. "acct-07".
    """
    bucket = zlib.crc32(account.encode()) % 10
    return "high" if bucket < 2 else "medium" if bucket < 5 else "low"


@tool(side_effect=True)
def freeze_account(account: str, reason: str, *, intent: IntentInfo) -> dict[str, object]:
    """Freeze an account at the bank; side-effecting, so only the effector runs it.

    Args:
        account: The account to freeze.
        reason: Why, for the bank's audit trail.
        intent: Injected by the effector; its id is the ledger's idempotency key.
    """
    with closing(connect_ledger(os.environ[LEDGER_ENV])) as ledger, ledger:
        ledger.execute(
            "INSERT INTO invocations (intent_id, attempt) VALUES (?, ?)",
            (intent.intent_id, intent.attempt),
        )
        ledger.execute(
            "INSERT OR IGNORE INTO freezes (intent_id, account, reason) VALUES (?, ?, ?)",
            (intent.intent_id, account, reason),
        )
    return {"account": account, "frozen": True}


def create_ledger(path: str) -> None:
    """Create the example bank's ledger at ``path`` if it is missing (in WAL mode)."""
    with closing(sqlite3.connect(path, timeout=30)) as connection:
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute(
            "CREATE TABLE IF NOT EXISTS invocations (intent_id TEXT NOT NULL, attempt INTEGER)"
        )
        connection.execute(
            "CREATE TABLE IF NOT EXISTS freezes"
            " (intent_id TEXT PRIMARY KEY, account TEXT NOT NULL, reason TEXT NOT NULL)"
        )


def connect_ledger(path: str) -> sqlite3.Connection:
    """Open the example bank's ledger, which ``create_ledger`` made."""
    return sqlite3.connect(path, timeout=30)


def make_pipeline_registry() -> ToolRegistry:
    """The pipeline's tools: the lookup it runs inline, the freeze whose intents it checks."""
    registry = ToolRegistry()
    registry.register(risk_lookup)
    registry.register(freeze_account)
    return registry


def make_effector_registry() -> ToolRegistry:
    """The tools the effector may execute: side-effecting ones. Creates the ledger."""
    if not os.environ.get(LEDGER_ENV):
        raise RuntimeError(f"set {LEDGER_ENV} to the bank ledger's path (a SQLite file)")
    create_ledger(os.environ[LEDGER_ENV])
    registry = ToolRegistry()
    registry.register(freeze_account)
    return registry
