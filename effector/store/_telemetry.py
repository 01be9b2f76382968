"""Telemetry and the console's queries: trace events, ``.errors`` records, keys, the overview.

Trace events and errors are inserted idempotently (a stored span id or error id is kept) and
forgotten after the telemetry retention. ``effector_key_activity`` keeps one row per key (when
it was last seen, how many runs have stored events), updated as traces and errors are recorded
(not by submits: the intake path writes what it did before), so the keys page walks its
index instead of aggregating the traces.
Reads probe or range-scan an index: a key's newest runs and errors, the keys most recently
seen (a substring search looks at the newest :data:`KEY_SEARCH_SCAN` of them only), the
errors, LLM spans and executions of the overview's window. Only the overview's intent counts
by state walk a whole index (one led by the state). The tables are described in
``effector/README.md``, "Telemetry tables".
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

import effector.store._reads as reads
import effector.store._tx as sql
from beam_agents._protos import AgentError, TraceEvent
from effector.intents import error_id_for
from effector.store.base import ErrorRecord, IntentRecord, KeySummary, Overview, Recorded

MINUTE_MS = 60_000
PRUNE_BATCH = 10_000
"""Rows deleted per table per transaction when telemetry is pruned."""
KEY_SEARCH_SCAN = 50_000
"""The most recently seen keys a key search looks through (an exact key is found at any age)."""
_PAIRS_PER_STATEMENT = sql.ROWS_PER_STATEMENT // 2
"""``(entity_key, seq)`` pairs per counting statement (two parameters each)."""
_TOKEN_ATTRIBUTES = ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens")
_TRACE_COLUMNS = (
    "trace_id, span_id, entity_key, seq, sequence, event_type, wall_start_ms, tokens, event, "
    "recorded_at_ms"
)
_ERROR_COLUMNS = "error_id, error, recorded_at_ms, redriven_at_ms"
_KEY_SUMMARY = f"""SELECT a.entity_key, a.runs, a.last_seen_ms,
      (SELECT COUNT(*) FROM effector_intents AS i
       WHERE i.entity_key = a.entity_key AND {sql.queued("i", check_state=False)})
      + (SELECT COUNT(*) FROM effector_intents AS i
         WHERE i.entity_key = a.entity_key AND i.state = 3)
    FROM {{source}} AS a"""
"""A :class:`KeySummary` per activity row of ``source``; open intents probe two partial indexes."""
_NEWEST_KEYS = "ORDER BY a.last_seen_ms DESC, a.entity_key DESC"
_EXECUTED = "state = 4 AND started_at_ms IS NOT NULL"
"""DONE intents that were executed (not decided, rejected or expired without a claim)."""


def telemetry_statements(dialect: sql.Dialect) -> list[str]:
    """The DDL of the telemetry tables and their indexes, idempotently."""
    blob, bigint = dialect.blob, dialect.bigint
    return [
        f"""CREATE TABLE IF NOT EXISTS effector_traces (
            trace_id TEXT NOT NULL,
            span_id TEXT NOT NULL,
            entity_key {blob} NOT NULL,
            seq {bigint} NOT NULL,
            sequence INTEGER NOT NULL,
            event_type INTEGER NOT NULL,
            wall_start_ms {bigint} NOT NULL,
            tokens {bigint} NOT NULL,
            event {blob} NOT NULL,
            recorded_at_ms {bigint} NOT NULL,
            PRIMARY KEY (trace_id, span_id))""",
        # A key's runs, newest first, each in event order.
        """CREATE INDEX IF NOT EXISTS effector_traces_by_key
            ON effector_traces (entity_key, seq, sequence)""",
        """CREATE INDEX IF NOT EXISTS effector_traces_age ON effector_traces (recorded_at_ms)""",
        """CREATE INDEX IF NOT EXISTS effector_traces_llm
            ON effector_traces (wall_start_ms) WHERE event_type = 2""",
        f"""CREATE TABLE IF NOT EXISTS effector_errors (
            error_id TEXT PRIMARY KEY,
            entity_key {blob} NOT NULL,
            reason TEXT NOT NULL,
            error {blob} NOT NULL,
            recorded_at_ms {bigint} NOT NULL,
            redriven_at_ms {bigint})""",
        """CREATE INDEX IF NOT EXISTS effector_errors_by_key
            ON effector_errors (entity_key, recorded_at_ms, error_id)""",
        """CREATE INDEX IF NOT EXISTS effector_errors_age
            ON effector_errors (recorded_at_ms, error_id)""",
        # One row per key seen: the keys page, most recently seen first.
        f"""CREATE TABLE IF NOT EXISTS effector_key_activity (
            entity_key {blob} PRIMARY KEY,
            last_seen_ms {bigint} NOT NULL,
            runs {bigint} NOT NULL)""",
        """CREATE INDEX IF NOT EXISTS effector_key_activity_seen
            ON effector_key_activity (last_seen_ms, entity_key)""",
    ]


def model_tokens(event: TraceEvent) -> int:
    """Input plus output tokens of an LLM_CALL event; a missing or unreadable count is 0."""
    if event.event_type != TraceEvent.LLM_CALL:
        return 0
    total = 0
    for name in _TOKEN_ATTRIBUTES:
        try:
            total += max(int(event.attributes.get(name, "0")), 0)
        except ValueError:
            continue
    return total


def _insert(
    tx: sql.Tx, table: str, columns: str, rows: Sequence[Sequence[Any]], returning: str
) -> tuple[Recorded, list[Any]]:
    """Insert ``rows`` (sorted: the lock order), keeping rows already stored; count both.

    Also returns the ``returning`` columns of the rows inserted.
    """
    width = columns.count(",") + 1
    inserted: list[Any] = []
    for chunk in sql.chunks(sorted(rows, key=lambda row: (row[0], row[1]))):
        inserted += tx.execute(
            f"INSERT INTO {table} ({columns}) VALUES {sql.row_marks(len(chunk), width)} "
            f"ON CONFLICT DO NOTHING RETURNING {returning}",
            sql.flatten(chunk),
        ).fetchall()
    return Recorded(recorded=len(inserted), duplicates=len(rows) - len(inserted)), inserted


def touch_keys(tx: sql.Tx, keys: Iterable[bytes], now_ms: int) -> None:
    """Note that something about ``keys`` was recorded at ``now_ms``, locking their rows.

    Rows are written in key order (the lock order); a new key starts with no runs.
    """
    rows = [(key, now_ms, 0) for key in sorted(keys)]
    for chunk in sql.chunks(rows):
        tx.execute(
            f"""INSERT INTO effector_key_activity (entity_key, last_seen_ms, runs)
                VALUES {sql.row_marks(len(chunk), 3)}
                ON CONFLICT (entity_key) DO UPDATE SET last_seen_ms = CASE
                  WHEN excluded.last_seen_ms > effector_key_activity.last_seen_ms
                  THEN excluded.last_seen_ms ELSE effector_key_activity.last_seen_ms END""",
            sql.flatten(chunk),
        )


def fill_key_activity(tx: sql.Tx) -> None:
    """Start ``effector_key_activity`` from the intents of a store migrated to version 3."""
    tx.execute(
        """INSERT INTO effector_key_activity (entity_key, last_seen_ms, runs)
           SELECT entity_key, MAX(COALESCE(completed_at_ms, received_at_ms)), 0
           FROM effector_intents WHERE 1 = 1 GROUP BY entity_key
           ON CONFLICT (entity_key) DO NOTHING"""
    )


def _events_by_run(tx: sql.Tx, runs: Sequence[tuple[bytes, int]]) -> Counter[tuple[bytes, int]]:
    """How many trace events each ``(entity_key, seq)`` of ``runs`` has stored (none: absent)."""
    stored: Counter[tuple[bytes, int]] = Counter()
    for chunk in sql.chunks(runs, _PAIRS_PER_STATEMENT):
        rows = tx.execute(
            f"""SELECT entity_key, seq, COUNT(*) FROM effector_traces
                WHERE {" OR ".join(["(entity_key = ? AND seq = ?)"] * len(chunk))}
                GROUP BY entity_key, seq""",
            sql.flatten(chunk),
        ).fetchall()
        stored.update({(bytes(key), int(seq)): int(count) for key, seq, count in rows})
    return stored


def _add_runs(tx: sql.Tx, runs: Counter[bytes]) -> None:
    """Add ``runs[key]`` (negative: take away) to each key's run count."""
    changes = [(change, key) for key, change in sorted(runs.items()) if change]
    if changes:
        tx.executemany(
            "UPDATE effector_key_activity SET runs = runs + ? WHERE entity_key = ?", changes
        )


def record_traces(tx: sql.Tx, events: Sequence[TraceEvent], now_ms: int) -> Recorded:
    """Store trace events; one already stored under ``(trace_id, span_id)`` is kept as it is.

    An event whose wall-clock start was not measured counts as started when it is recorded.
    The keys of the events stored are touched and count each run that had no events before:
    their rows are locked before the runs are counted, so concurrent calls count a run once.
    """
    rows = [
        (
            event.trace_id,
            event.span_id,
            event.entity_key,
            event.seq,
            event.sequence,
            event.event_type,
            event.wall_start_unix_nano // 1_000_000 or now_ms,
            model_tokens(event),
            event.SerializeToString(deterministic=True),
            now_ms,
        )
        for event in events
    ]
    recorded, inserted = _insert(tx, "effector_traces", _TRACE_COLUMNS, rows, "entity_key, seq")
    if not inserted:
        return recorded
    new: Counter[tuple[bytes, int]] = Counter((bytes(key), int(seq)) for key, seq in inserted)
    touch_keys(tx, {key for key, _ in new}, now_ms)
    stored = _events_by_run(tx, sorted(new))
    _add_runs(tx, Counter(key for (key, seq), count in new.items() if stored[key, seq] == count))
    return recorded


def record_errors(tx: sql.Tx, errors: Sequence[AgentError], now_ms: int) -> Recorded:
    """Store ``.errors`` records under their :func:`error_id_for` digest; a stored one is kept."""
    rows = [
        (error_id_for(error), error.entity_key, error.reason, error.SerializeToString(), now_ms)
        for error in errors
    ]
    recorded, inserted = _insert(
        tx,
        "effector_errors",
        "error_id, entity_key, reason, error, recorded_at_ms",
        rows,
        "entity_key",
    )
    touch_keys(tx, {bytes(key) for (key,) in inserted}, now_ms)
    return recorded


def traces_for_key(tx: sql.Tx, entity_key: bytes, max_runs: int) -> list[TraceEvent]:
    """The events of the key's newest ``max_runs`` runs, by seq, then sequence."""
    if max_runs <= 0:
        return []
    newest = tx.execute(
        """SELECT DISTINCT seq FROM effector_traces WHERE entity_key = ?
           ORDER BY seq DESC LIMIT ?""",
        (entity_key, max_runs),
    ).fetchall()
    if not newest:
        return []
    rows = tx.execute(
        """SELECT event FROM effector_traces WHERE entity_key = ? AND seq >= ?
           ORDER BY seq, sequence, span_id""",
        (entity_key, newest[-1][0]),
    ).fetchall()
    return [TraceEvent.FromString(bytes(blob)) for (blob,) in rows]


def list_keys(tx: sql.Tx, dialect: sql.Dialect, search: bytes, limit: int) -> list[KeySummary]:
    """Keys containing ``search`` (every key if empty), most recently seen first.

    A search looks through the :data:`KEY_SEARCH_SCAN` keys seen most recently, plus the key
    equal to ``search`` however long ago it was seen.
    """
    if not search:
        rows = tx.execute(
            f"{_KEY_SUMMARY.format(source='effector_key_activity')} {_NEWEST_KEYS} LIMIT ?",
            (limit,),
        ).fetchall()
    else:
        recent = f"(SELECT * FROM effector_key_activity AS a {_NEWEST_KEYS} LIMIT ?)"
        contains = dialect.contains_bytes.format(haystack="a.entity_key", needle="?")
        rows = tx.execute(
            f"{_KEY_SUMMARY.format(source=recent)} WHERE {contains} {_NEWEST_KEYS} LIMIT ?",
            (KEY_SEARCH_SCAN, search, limit),
        ).fetchall()
        rows += tx.execute(
            f"{_KEY_SUMMARY.format(source='effector_key_activity')} WHERE a.entity_key = ?",
            (search,),
        ).fetchall()
    found = {bytes(key): (int(runs), int(seen), int(open_)) for key, runs, seen, open_ in rows}
    newest = sorted(found, key=lambda key: (found[key][1], key), reverse=True)[:limit]
    return [KeySummary(key, *found[key]) for key in newest]


def _error_record(row: Any) -> ErrorRecord:
    error_id, blob, recorded_at_ms, redriven_at_ms = row
    return ErrorRecord(error_id, AgentError.FromString(bytes(blob)), recorded_at_ms, redriven_at_ms)


def list_errors(tx: sql.Tx, entity_key: bytes | None, limit: int) -> list[ErrorRecord]:
    """Stored errors (of one key, if given), newest first (by recording, then id)."""
    where, params = ("WHERE entity_key = ? ", (entity_key,)) if entity_key is not None else ("", ())
    rows = tx.execute(
        f"""SELECT {_ERROR_COLUMNS} FROM effector_errors {where}
            ORDER BY recorded_at_ms DESC, error_id DESC LIMIT ?""",
        (*params, limit),
    ).fetchall()
    return [_error_record(row) for row in rows]


def get_error(tx: sql.Tx, error_id: str) -> ErrorRecord | None:
    """One stored error, or ``None``."""
    row = tx.execute(
        f"SELECT {_ERROR_COLUMNS} FROM effector_errors WHERE error_id = ?", (error_id,)
    ).fetchone()
    return None if row is None else _error_record(row)


def mark_redriven(tx: sql.Tx, error_id: str, now_ms: int, again: bool) -> bool:
    """Claim an error for a re-drive (once, unless ``again``); ``False`` if it is unknown."""
    once = "" if again else " AND redriven_at_ms IS NULL"
    return bool(
        tx.execute(
            f"UPDATE effector_errors SET redriven_at_ms = ? WHERE error_id = ?{once}",
            (now_ms, error_id),
        ).rowcount
    )


def overview(tx: sql.Tx, now_ms: int, window_ms: int) -> Overview:
    """The overview's figures over whole minutes, from the one ``window_ms`` reaches into to now."""
    minutes = max(1, math.ceil(window_ms / MINUTE_MS))
    end = now_ms - now_ms % MINUTE_MS + MINUTE_MS
    start = end - minutes * MINUTE_MS

    def per_minute(figure: str, table: str, time: str, condition: str) -> list[tuple[int, int]]:
        totals = dict(
            tx.execute(
                f"""SELECT ({time} - ?) / {MINUTE_MS}, {figure} FROM {table}
                    WHERE {condition} AND {time} >= ? AND {time} < ? GROUP BY 1""",
                (start, start, end),
            ).fetchall()
        )
        return [
            (start + minute * MINUTE_MS, int(totals.get(minute, 0))) for minute in range(minutes)
        ]

    counts = reads.counts(tx)
    p50, p99 = _latency_percentiles(tx, start, end, (0.5, 0.99))
    return Overview(
        counts=counts,
        executions_per_minute=per_minute(
            "COUNT(*)", "effector_intents", "completed_at_ms", _EXECUTED
        ),
        errors_per_minute=per_minute("COUNT(*)", "effector_errors", "recorded_at_ms", "1 = 1"),
        tokens_per_minute=per_minute(
            "SUM(tokens)", "effector_traces", "wall_start_ms", "event_type = 2"
        ),
        tool_latency_p50_ms=p50,
        tool_latency_p99_ms=p99,
        pending_approvals=counts.awaiting_decision,
        oldest_open=_oldest_open(tx),
    )


def _latency_percentiles(
    tx: sql.Tx, start: int, end: int, quantiles: Sequence[float]
) -> list[float | None]:
    """Claim-to-result latencies of the executions completed in ``[start, end)``, interpolated."""
    executed = f"FROM effector_intents WHERE {_EXECUTED}"
    window = "AND completed_at_ms >= ? AND completed_at_ms < ?"
    (count,) = tx.execute(f"SELECT COUNT(*) {executed} {window}", (start, end)).fetchone()
    if not count:
        return [None] * len(quantiles)
    figures: list[float | None] = []
    for quantile in quantiles:
        position = quantile * (count - 1)
        below = math.floor(position)
        values = [
            int(latency)
            for (latency,) in tx.execute(
                f"""SELECT completed_at_ms - started_at_ms AS latency {executed} {window}
                    ORDER BY latency LIMIT 2 OFFSET ?""",
                (start, end, below),
            ).fetchall()
        ]
        above = values[-1] if position > below else values[0]
        figures.append(values[0] + (above - values[0]) * (position - below))
    return figures


def _oldest_open(tx: sql.Tx) -> IntentRecord | None:
    """The intent not yet DONE that was received first: the head of each open state's index."""
    heads = [
        row
        for state in (sql.PENDING, sql.RUNNING, sql.IN_DOUBT, sql.AWAITING)
        for row in tx.execute(
            f"""SELECT {reads.RECORD_COLUMNS}, intent_id FROM effector_intents WHERE state = ?
                ORDER BY received_at_ms, intent_id LIMIT 1""",
            (state,),
        ).fetchall()
    ]
    if not heads:
        return None
    return reads.intent_record(min(heads, key=lambda row: (row[4], row[-1]))[:-1])


def prune_telemetry(tx: sql.Tx, dialect: sql.Dialect, cutoff_ms: int) -> int:
    """Forget up to a batch of traces, of errors and of idle keys from before ``cutoff_ms``.

    A key loses each run left without events; a key with no runs, not seen since the cutoff,
    is forgotten (its intents stay searchable). Key rows are locked in key order, after the
    traces, as :func:`record_traces` locks them.
    """
    idle = tx.execute(
        """SELECT entity_key FROM effector_key_activity WHERE last_seen_ms < ?
           ORDER BY last_seen_ms LIMIT ?""",
        (cutoff_ms, PRUNE_BATCH),
    ).fetchall()
    gone = tx.execute(
        """DELETE FROM effector_traces WHERE (trace_id, span_id) IN (
             SELECT trace_id, span_id FROM effector_traces WHERE recorded_at_ms < ?
             ORDER BY recorded_at_ms LIMIT ?)
           RETURNING entity_key, seq""",
        (cutoff_ms, PRUNE_BATCH),
    ).fetchall()
    runs = sorted({(bytes(key), int(seq)) for key, seq in gone})
    idle_keys = sorted({bytes(key) for (key,) in idle})
    _lock_keys(tx, dialect, sorted({key for key, _ in runs}.union(idle_keys)))
    left = _events_by_run(tx, runs)
    emptied = Counter(key for key, seq in runs if not left[key, seq])
    _add_runs(tx, Counter({key: -count for key, count in emptied.items()}))
    removed = len(gone)
    for chunk in sql.chunks(idle_keys):
        removed += tx.execute(
            f"""DELETE FROM effector_key_activity WHERE entity_key IN ({sql.marks(len(chunk))})
                AND runs = 0 AND last_seen_ms < ?""",
            (*chunk, cutoff_ms),
        ).rowcount
    return removed + sql.delete_oldest(
        tx, "effector_errors", ["error_id"], "recorded_at_ms", cutoff_ms, PRUNE_BATCH
    )


def _lock_keys(tx: sql.Tx, dialect: sql.Dialect, keys: Sequence[bytes]) -> None:
    """Lock the activity rows of ``keys`` (sorted), in key order; SQLite needs no row locks."""
    if not dialect.for_update:
        return
    for chunk in sql.chunks(keys):
        tx.execute(
            f"""SELECT entity_key FROM effector_key_activity
                WHERE entity_key IN ({sql.marks(len(chunk))})
                ORDER BY entity_key{dialect.for_update}""",
            chunk,
        ).fetchall()
