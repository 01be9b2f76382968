"""The tools the reliability gates' effectors execute, and the ledger they write.

The ledger is a SQLite file named by ``GATE_LEDGER`` in the effector's environment, so the
tools, running inside effector subprocesses, write where the test reads. Two tables:

- ``invocations``: one row per raw tool invocation, written *before* the effect, with the
  intent id, the effector's attempt number, the process id and a system-wide monotonic
  timestamp. A crash of the effector between this row and the recorded result is what makes
  the effector run the tool again, so the gates can tell which re-executions a kill explains.
- ``effects``: the effect itself, applied only if no effect with the same intent id exists
  (checked in the same transaction): the idempotent-ledger pattern, in which the intent id is
  the downstream idempotency key and a second invocation of the same intent changes nothing.
  The table has no unique constraint, so a duplicate effect would show as a second row.

The effector loads ``tests.semantics.gate_tools:make_registry``, or
``make_reconciling_registry``: the same tools (same names and arguments), each with a
reconciler that looks its intent id up in ``effects`` and writes a row to ``reconciliations``
per call. Those tools stand for a downstream system that applies a request atomically: they
wait out the latency first (the request in flight) and then write the invocation row and the
effect in one transaction, so a tool killed in flight leaves no row and the reconciler rightly
answers "not found"; an ``invocations`` row then means a request the downstream received, and
two rows for one intent a duplicate invocation. ``GATE_RECONCILER=raise`` in the effector's
environment makes every reconciler raise instead; ``GATE_EFFECT_LATENCY_S`` overrides the
latency.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections import Counter
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from beam_agents.tools import IntentInfo, Reconciled, ToolRegistry, tool

LEDGER_ENV = "GATE_LEDGER"
RECONCILER_ENV = "GATE_RECONCILER"
LATENCY_ENV = "GATE_EFFECT_LATENCY_S"
REGISTRY_SPEC = "tests.semantics.gate_tools:make_registry"
RECONCILING_REGISTRY_SPEC = "tests.semantics.gate_tools:make_reconciling_registry"
EFFECT_LATENCY_S = 0.02
"""How long ``apply_effect`` takes between its invocation row and its effect, standing in for
the call to a downstream system, so that an effector killed at a random moment usually has
some tools inside that window (the only one in which an intent can run twice)."""


def create_ledger(path: Path) -> Path:
    """Create an empty ledger at ``path`` before any tool runs (WAL set up once, up front)."""
    with closing(sqlite3.connect(path, isolation_level=None)) as connection:
        # WAL without fsync: the ledger must survive a SIGKILL of the effector, not power loss.
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute(
            "CREATE TABLE invocations (intent_id TEXT NOT NULL, entity_key BLOB NOT NULL, "
            "attempt INTEGER NOT NULL, tool TEXT NOT NULL, pid INTEGER NOT NULL, "
            "at_ns INTEGER NOT NULL)"
        )
        connection.execute(
            "CREATE TABLE effects (intent_id TEXT NOT NULL, entity_key BLOB NOT NULL, "
            "detail TEXT NOT NULL)"
        )
        connection.execute("CREATE INDEX effects_by_intent ON effects (intent_id)")
        connection.execute(
            "CREATE TABLE reconciliations (intent_id TEXT NOT NULL, attempt INTEGER NOT NULL, "
            "outcome TEXT NOT NULL)"
        )
    return path


def _ledger_path() -> str:
    path = os.environ.get(LEDGER_ENV)
    if not path:
        raise RuntimeError(f"{LEDGER_ENV} is not set: the gate tools have nowhere to record")
    return path


def _record(
    tool_name: str,
    intent: IntentInfo,
    detail: str,
    *,
    latency_s: float = 0.0,
    atomic: bool = False,
) -> None:
    """Write the invocation row, wait ``latency_s`` (the downstream call), apply the effect.

    ``atomic``: wait first, then write the invocation row and the effect in one transaction.
    """
    latency_s = float(os.environ.get(LATENCY_ENV, latency_s)) if latency_s else 0.0
    with closing(sqlite3.connect(_ledger_path(), timeout=60, isolation_level=None)) as connection:
        connection.execute("PRAGMA synchronous=OFF")
        if atomic:
            time.sleep(latency_s)
            connection.execute("BEGIN IMMEDIATE")
        connection.execute(
            "INSERT INTO invocations VALUES (?, ?, ?, ?, ?, ?)",
            (
                intent.intent_id,
                intent.entity_key,
                intent.attempt,
                tool_name,
                os.getpid(),
                time.monotonic_ns(),
            ),
        )
        if not atomic:
            time.sleep(latency_s)
            connection.execute("BEGIN IMMEDIATE")
        connection.execute(
            "INSERT INTO effects SELECT ?, ?, ? "
            "WHERE NOT EXISTS (SELECT 1 FROM effects WHERE intent_id = ?)",
            (intent.intent_id, intent.entity_key, detail, intent.intent_id),
        )
        connection.execute("COMMIT")


@tool(side_effect=True)
def apply_effect(event_id: str, amount: int, *, intent: IntentInfo) -> dict[str, object]:
    """Apply one event's effect to the ledger, idempotently by intent id.

    Args:
        event_id: The event the effect belongs to.
        amount: What the effect moves.
    """
    _record("apply_effect", intent, f"{event_id}:{amount}", latency_s=EFFECT_LATENCY_S)
    return {"event_id": event_id, "applied": amount}


@tool(side_effect=True)
def touch(note: str, *, intent: IntentInfo) -> str:
    """Record an execution (the fuzzing gate's tool with a string argument).

    Args:
        note: Free text, echoed back.
    """
    _record("touch", intent, note)
    return note


@tool(side_effect=True)
def tally(count: int, flag: bool = False, *, intent: IntentInfo) -> int:
    """Record an execution (the fuzzing gate's tool with typed, partly optional arguments).

    Args:
        count: Any integer.
        flag: Any boolean.
    """
    _record("tally", intent, f"{count}:{flag}")
    return count


@tool
def peek(name: str) -> str:
    """A read-only tool: the effector must refuse every intent naming it.

    Args:
        name: Anything.
    """
    return name


def make_registry() -> ToolRegistry:
    """A fresh registry of every gate tool."""
    return ToolRegistry([apply_effect, touch, tally, peek])


@tool(name="apply_effect", side_effect=True)
def apply_effect_atomically(event_id: str, amount: int, *, intent: IntentInfo) -> dict[str, object]:
    """Apply one event's effect to the ledger, idempotently by intent id.

    Args:
        event_id: The event the effect belongs to.
        amount: What the effect moves.
    """
    _record("apply_effect", intent, f"{event_id}:{amount}", latency_s=EFFECT_LATENCY_S, atomic=True)
    return {"event_id": event_id, "applied": amount}


@tool(name="touch", side_effect=True)
def touch_atomically(note: str, *, intent: IntentInfo) -> str:
    """Record an execution (the fuzzing gate's tool with a string argument).

    Args:
        note: Free text, echoed back.
    """
    _record("touch", intent, note, atomic=True)
    return note


@tool(name="tally", side_effect=True)
def tally_atomically(count: int, flag: bool = False, *, intent: IntentInfo) -> int:
    """Record an execution (the fuzzing gate's tool with typed, partly optional arguments).

    Args:
        count: Any integer.
        flag: Any boolean.
    """
    _record("tally", intent, f"{count}:{flag}", atomic=True)
    return count


def _reconcile(intent: IntentInfo, result: object) -> Reconciled | None:
    """Look the intent id up in ``effects``: found, its tool's result; logged either way."""
    with closing(sqlite3.connect(_ledger_path(), timeout=60, isolation_level=None)) as connection:
        connection.execute("PRAGMA synchronous=OFF")
        raising = os.environ.get(RECONCILER_ENV) == "raise"
        found = connection.execute(
            "SELECT 1 FROM effects WHERE intent_id = ?", (intent.intent_id,)
        ).fetchone()
        outcome = "raised" if raising else "found" if found else "not_found"
        connection.execute(
            "INSERT INTO reconciliations VALUES (?, ?, ?)",
            (intent.intent_id, intent.attempt, outcome),
        )
    if raising:
        raise ConnectionError("the ledger cannot be asked (GATE_RECONCILER=raise)")
    return Reconciled(result) if found else None


@apply_effect_atomically.reconciler
def find_applied_effect(intent: IntentInfo, args: dict[str, Any]) -> Reconciled | None:
    """``apply_effect``'s result if its effect is in the ledger."""
    return _reconcile(intent, {"event_id": args["event_id"], "applied": args["amount"]})


@touch_atomically.reconciler
def find_touch(intent: IntentInfo, args: dict[str, Any]) -> Reconciled | None:
    """``touch``'s result if its effect is in the ledger."""
    return _reconcile(intent, args["note"])


@tally_atomically.reconciler
def find_tally(intent: IntentInfo, args: dict[str, Any]) -> Reconciled | None:
    """``tally``'s result if its effect is in the ledger."""
    return _reconcile(intent, args["count"])


def make_reconciling_registry() -> ToolRegistry:
    """A fresh registry of the gate tools with a reconciler on every side-effecting one."""
    return ToolRegistry([apply_effect_atomically, touch_atomically, tally_atomically, peek])


@dataclass(frozen=True)
class Invocation:
    """One raw tool invocation, as its ``invocations`` row recorded it."""

    intent_id: str
    entity_key: bytes
    attempt: int
    tool: str
    pid: int
    at_ns: int


@dataclass(frozen=True)
class Ledger:
    """Everything the gate tools recorded, read back at once."""

    invocations: list[Invocation]
    effects: Counter[str]
    """Rows in ``effects`` per intent id."""
    effect_details: Counter[str]
    """Rows in ``effects`` per detail (for ``apply_effect``: per event)."""
    reconciliations: Counter[str]
    """Reconciler calls by outcome: ``found``, ``not_found`` or ``raised``."""

    @classmethod
    def read(cls, path: Path) -> Ledger:
        """Read the ledger at ``path``."""
        with closing(sqlite3.connect(path, timeout=60)) as connection:
            invocations = [
                Invocation(*row)
                for row in connection.execute("SELECT * FROM invocations ORDER BY rowid")
            ]
            effects = list(connection.execute("SELECT intent_id, detail FROM effects"))
            outcomes = [row[0] for row in connection.execute("SELECT outcome FROM reconciliations")]
        return cls(
            invocations,
            Counter(intent_id for intent_id, _ in effects),
            Counter(detail for _, detail in effects),
            Counter(outcomes),
        )

    def invocation_counts(self) -> Counter[str]:
        """Raw invocations per intent id."""
        return Counter(invocation.intent_id for invocation in self.invocations)
