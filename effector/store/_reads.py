"""Reads and retention: the envelope log, one intent, the intents in a state, the counts.

Reads run in read-only transactions (on SQLite, on a connection of their own); searches walk
an index newest first. :func:`prune` forgets DONE intents and envelopes older than the
retention, a bounded batch per call.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from beam_agents._protos import AgentEnvelope, IntentState, ToolIntent, ToolResult
from effector.store._tx import (
    AWAITING,
    DONE,
    IN_DOUBT,
    PENDING,
    RUNNING,
    Tx,
    delete_oldest,
    parse_result,
    read_head,
)
from effector.store.base import IntentRecord, LogRecord, StoreCounts

_PRUNE_BATCH = 10_000
"""Rows deleted per table per prune call, so one prune never holds the store for long."""
_FAILED_SCAN_BATCH = 1_000
"""DONE intents read per query while looking for failed ones."""
_SEARCH_SCAN_BATCH = 500
"""Intents read per query of each scan while searching."""
_IN_FLIGHT = (PENDING, RUNNING, AWAITING, IN_DOUBT)
"""Every state but DONE."""
_SUCCEEDED = frozenset({ToolResult.OK, ToolResult.NOT_NEEDED})
"""Results that are not failures: OK, and a compensation that had nothing to undo."""
RECORD_COLUMNS = (
    "intent, state, result, attempts, received_at_ms, started_at_ms, completed_at_ms, "
    "in_doubt_reason, retry_at_ms"
)
"""The columns :func:`intent_record` reads, in order."""


def read_log(tx: Tx, from_offset: int, max_records: int) -> list[LogRecord]:
    """Envelopes from ``from_offset`` on, in offset order, at most ``max_records``."""
    rows = tx.execute(
        """SELECT log_offset, envelope FROM effector_envelopes
           WHERE log_offset >= ? ORDER BY log_offset LIMIT ?""",
        (from_offset, max_records),
    ).fetchall()
    return [LogRecord(int(offset), AgentEnvelope.FromString(bytes(blob))) for offset, blob in rows]


def intent_record(row: Sequence[Any]) -> IntentRecord:
    """The :class:`IntentRecord` of a row holding :data:`RECORD_COLUMNS`."""
    blob, state, result, attempts, received_at_ms, started_at_ms, completed_at_ms = row[:7]
    in_doubt_reason, retry_at_ms = row[7:9]
    return IntentRecord(
        ToolIntent.FromString(bytes(blob)),
        state,
        parse_result(result),
        attempts,
        received_at_ms=received_at_ms,
        started_at_ms=started_at_ms,
        completed_at_ms=completed_at_ms,
        in_doubt_reason=in_doubt_reason or "",
        retry_at_ms=retry_at_ms,
    )


def get_intent(tx: Tx, intent_id: str) -> IntentRecord | None:
    """Everything recorded about one intent, or ``None``."""
    row = tx.execute(
        f"SELECT {RECORD_COLUMNS} FROM effector_intents WHERE intent_id = ?", (intent_id,)
    ).fetchone()
    return None if row is None else intent_record(row)


def search_intents(
    tx: Tx,
    state: IntentState | None,
    tool_name: str | None,
    entity_key: bytes | None,
    limit: int,
) -> list[IntentRecord]:
    """Intents matching every filter given, newest first by receipt (then id), at most ``limit``.

    Each scan follows an index newest first, a batch at a time: the key's with a key (the
    other filters checked on its rows' columns), else the tool's with a tool, else the
    state's; without a state, one scan per state, merged.
    """
    conditions: list[tuple[str, Any]] = []
    if entity_key is not None:
        conditions.append(("entity_key = ?", entity_key))
    if tool_name is not None:
        conditions.append(("tool_name = ?", tool_name))
    if entity_key is not None:
        if state is not None:
            conditions.append(("state = ?", state))
        scans = [_newest_first(tx, conditions)]
    else:
        states = [state] if state is not None else [PENDING, RUNNING, IN_DOUBT, AWAITING, DONE]
        scans = [_newest_first(tx, [*conditions, ("state = ?", each)]) for each in states]
    rows = heapq.merge(*scans, key=lambda row: (row[4], row[-1]), reverse=True)
    return [intent_record(row[:-1]) for row in itertools.islice(rows, max(limit, 0))]


def _newest_first(tx: Tx, conditions: Sequence[tuple[str, Any]]) -> Iterator[Any]:
    """Rows of intents meeting ``conditions``, newest first by receipt, then id, in batches."""
    after: tuple[Any, ...] = ()
    while True:
        where = [condition for condition, _ in conditions]
        if after:
            where.append("(received_at_ms, intent_id) < (?, ?)")
        rows = tx.execute(
            f"SELECT {RECORD_COLUMNS}, intent_id FROM effector_intents WHERE {' AND '.join(where)}"
            " ORDER BY received_at_ms DESC, intent_id DESC LIMIT ?",
            (*(value for _, value in conditions), *after, _SEARCH_SCAN_BATCH),
        ).fetchall()
        yield from rows
        if len(rows) < _SEARCH_SCAN_BATCH:
            return
        after = (rows[-1][4], rows[-1][-1])


def list_intents(tx: Tx, state: IntentState, limit: int) -> list[ToolIntent]:
    """At most ``limit`` intents in ``state``, oldest first (by first receipt, then id)."""
    rows = tx.execute(
        """SELECT intent FROM effector_intents WHERE state = ?
           ORDER BY received_at_ms, intent_id LIMIT ?""",
        (state, limit),
    ).fetchall()
    return [ToolIntent.FromString(bytes(blob)) for (blob,) in rows]


def list_failed(tx: Tx, limit: int) -> list[tuple[ToolIntent, ToolResult]]:
    """At most ``limit`` DONE intents whose result is not OK, with it, oldest first (receipt, id).

    A result's status is inside its bytes, so DONE intents are read a batch at a time, in the
    order of the ``(state, received_at_ms, intent_id)`` index, until enough failed ones are found.
    """
    found: list[tuple[ToolIntent, ToolResult]] = []
    after: tuple[int, str] | None = None
    params: tuple[int, str] | tuple[()]
    while len(found) < limit:
        where, params = "", ()
        if after is not None:
            where, params = " AND (received_at_ms, intent_id) > (?, ?)", after
        rows = tx.execute(
            "SELECT intent, result, received_at_ms, intent_id FROM effector_intents"
            f" WHERE state = ?{where} ORDER BY received_at_ms, intent_id LIMIT ?",
            (DONE, *params, _FAILED_SCAN_BATCH),
        ).fetchall()
        for blob, result_blob, _, _ in rows:
            result = parse_result(result_blob)
            if result is not None and result.status not in _SUCCEEDED:
                found.append((ToolIntent.FromString(bytes(blob)), result))
        if len(rows) < _FAILED_SCAN_BATCH:
            break
        after = (rows[-1][2], rows[-1][3])
    return found[:limit]


def counts(tx: Tx, *, done: bool = True) -> StoreCounts:
    """How many intents are in each state, and the log head.

    ``done=False`` leaves DONE intents uncounted (``done`` reads 0): they are most of a
    retained table, so the periodic callers, which need only the rest, seek those states in
    the by-state index instead of walking all of it.
    """
    if done:
        rows = tx.execute("SELECT state, COUNT(*) FROM effector_intents GROUP BY state")
    else:
        rows = tx.execute(
            "SELECT state, COUNT(*) FROM effector_intents"
            f" WHERE state IN ({', '.join('?' * len(_IN_FLIGHT))}) GROUP BY state",
            _IN_FLIGHT,
        )
    by_state = dict(rows.fetchall())
    return StoreCounts(
        pending=int(by_state.get(PENDING, 0)),
        running=int(by_state.get(RUNNING, 0)),
        awaiting_decision=int(by_state.get(AWAITING, 0)),
        done=int(by_state.get(DONE, 0)),
        head_offset=read_head(tx),
        in_doubt=int(by_state.get(IN_DOUBT, 0)),
    )


def prune(tx: Tx, now_ms: int, retention_ms: int) -> int:
    """Forget DONE intents, envelopes and idle keys past the retention; returns rows removed."""
    cutoff = now_ms - retention_ms
    removed = delete_oldest(
        tx, "effector_intents", ["intent_id"], "completed_at_ms", cutoff, _PRUNE_BATCH, "state = 4"
    )
    removed += delete_oldest(
        tx, "effector_envelopes", ["log_offset"], "appended_at_ms", cutoff, _PRUNE_BATCH
    )
    removed += tx.execute(
        "DELETE FROM effector_keys WHERE pending = 0 AND claim_token IS NULL"
    ).rowcount
    return removed
