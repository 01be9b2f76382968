"""``TelemetryTables``: what the pipeline's sinks record for the console, and its reads of it.

Trace events, agent errors and activation records, each stored once under its identity, and
the per-key activity (last seen, runs) the console's key list reads.
:class:`~effector.store.sql.SqlStore` inherits these verbs; like its own, each runs one
transaction through ``_run``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import effector.store.schema as sql
from beam_agents._protos import ActivationRecord, AgentError, TraceEvent
from effector.store.intents import ErrorRecord, KeySummary, Recorded, error_id_for

_T = TypeVar("_T")

KEY_SEARCH_SCAN = 50_000
"""The most recently seen keys a key search looks through (an exact key is found at any age)."""
_RUNS_PER_STATEMENT = sql.ROWS_PER_STATEMENT // 3
"""``(entity_key, seq, trace_id)`` runs per counting statement (three parameters each)."""
_TOKEN_ATTRIBUTES = ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens")
_TRACE_COLUMNS = (
    "trace_id, span_id, entity_key, seq, sequence, event_type, wall_start_ms, tokens, event, "
    "recorded_at_ms"
)
_ERROR_COLUMNS = "error_id, error, recorded_at_ms, redriven_at_ms"
_RECORD_COLUMNS = "entity_key, seq, intent_namespace, trace_sequence, record, recorded_at_ms"
_KEY_SUMMARY = f"""SELECT a.entity_key, a.runs, a.last_seen_ms,
      (SELECT COUNT(*) FROM effector_intents AS i
       WHERE i.entity_key = a.entity_key AND i.{sql.OPEN})
    FROM {{source}} AS a"""
"""A :class:`KeySummary` per activity row of ``source``; open intents counted on their index."""
_NEWEST_KEYS = "ORDER BY a.last_seen_ms DESC, a.entity_key DESC"


@dataclass(frozen=True, slots=True)
class RunHead:
    """A run as the store lists it: its seq, trace and how many spans it has."""

    seq: int
    trace_id: str
    spans: int
    last_event: int = TraceEvent.EVENT_TYPE_UNSPECIFIED
    """The type of its newest event, which says how the run stands."""


@dataclass(frozen=True, slots=True)
class RecordPlace:
    """Where an activation record sits in its key's order: seq, then namespace, then position."""

    seq: int
    trace_sequence: int
    intent_namespace: str


@dataclass(frozen=True, slots=True)
class RecordsPage:
    """A page of one key's activation records, oldest first, and whether older ones remain."""

    records: list[ActivationRecord]
    more: bool


RECORD_OVERHEAD_BYTES = 16
"""What one record adds to its size in an answer, at most (its tag and length)."""
_PLACES_PER_READ = 1_000
"""Record places (seq, namespace, position, size) a page reads per statement."""


MAX_EVENT_TOKENS = 2**32
"""The most tokens one event counts for: far above any model call, far below BIGINT sums."""


def model_tokens(event: TraceEvent) -> int:
    """Input plus output tokens of an LLM_CALL event; a missing or unreadable count is 0.

    At most :data:`MAX_EVENT_TOKENS`, so sums over many events stay within a BIGINT.
    """
    if event.event_type != TraceEvent.LLM_CALL:
        return 0
    total = 0
    for name in _TOKEN_ATTRIBUTES:
        try:
            total += max(int(event.attributes.get(name, "0")), 0)
        except ValueError:
            continue
    return min(total, MAX_EVENT_TOKENS)


def _error_record(row: Any) -> ErrorRecord:
    error_id, blob, recorded_at_ms, redriven_at_ms = row
    return ErrorRecord(error_id, AgentError.FromString(bytes(blob)), recorded_at_ms, redriven_at_ms)


class TelemetryTables:
    """The telemetry verbs of :class:`~effector.store.sql.SqlStore`, which mixes them in."""

    if TYPE_CHECKING:  # supplied by SqlStore
        _dialect: sql.Dialect

        async def _run(self, work: Callable[[sql.Tx], _T], *, write: bool = True) -> _T: ...

    async def record_traces(self, events: Sequence[TraceEvent], now_ms: int) -> Recorded:
        """Store trace events, idempotent on ``(trace_id, span_id)``: a stored one is kept."""
        return await self._run(lambda tx: _record_traces(tx, events, now_ms))

    async def record_errors(self, errors: Sequence[AgentError], now_ms: int) -> Recorded:
        """Store ``.errors`` records under their ``error_id_for`` digest; a stored one is kept."""

        def record(tx: sql.Tx) -> Recorded:
            rows = [
                (
                    error_id_for(error),
                    error.entity_key,
                    sql.text(error.reason),
                    error.SerializeToString(),
                    now_ms,
                )
                for error in errors
            ]
            columns = "error_id, entity_key, reason, error, recorded_at_ms"
            recorded, inserted = _insert(tx, "effector_errors", columns, rows, "entity_key")
            _touch_keys(tx, {bytes(key) for (key,) in inserted}, now_ms)
            return recorded

        return await self._run(record)

    async def record_activations(
        self, records: Sequence[ActivationRecord], now_ms: int
    ) -> Recorded:
        """Store activation records, idempotent on their run and place in it.

        A run is ``(entity_key, seq, intent_namespace)``: runs of different namespaces on one key
        and seq are kept apart.
        """

        def record(tx: sql.Tx) -> Recorded:
            rows = sorted(
                (
                    record.entity_key,
                    record.seq,
                    sql.text(record.intent_namespace),
                    record.trace_sequence,
                    record.SerializeToString(deterministic=True),
                    now_ms,
                )
                for record in records
            )  # by the whole identity: concurrent writers lock rows in the same order
            recorded = 0
            for chunk in sql.chunks(rows):
                recorded += tx.execute(
                    f"INSERT INTO effector_records ({_RECORD_COLUMNS}) VALUES "
                    f"{sql.row_marks(len(chunk), 6)} ON CONFLICT DO NOTHING",
                    sql.flatten(chunk),
                ).rowcount
            return Recorded(recorded=recorded, duplicates=len(rows) - recorded)

        return await self._run(record)

    async def records_for_key(
        self, entity_key: bytes, max_runs: int, *, before_seq: int | None = None
    ) -> list[ActivationRecord]:
        """The records of the key's newest ``max_runs`` runs (below ``before_seq``), in order."""
        run = ("effector_records", "record", "intent_namespace, trace_sequence")
        blobs = await self._newest_runs(*run, entity_key, max_runs, before_seq)
        return [ActivationRecord.FromString(blob) for blob in blobs]

    async def records_before(
        self,
        entity_key: bytes,
        max_runs: int,
        max_bytes: int,
        *,
        before: RecordPlace | None = None,
        namespace: str | None = None,
    ) -> RecordsPage:
        """The key's newest records before ``before`` (of ``namespace`` only, if given).

        At most ``max_runs`` runs (seqs) and ``max_bytes`` (with :data:`RECORD_OVERHEAD_BYTES`
        each), but always one record if any remains: a page ends inside a run when it must.
        """
        where = "entity_key = ?" if namespace is None else "entity_key = ? AND intent_namespace = ?"
        params: tuple[Any, ...] = (
            (entity_key,) if namespace is None else (entity_key, sql.text(namespace))
        )

        def page(tx: sql.Tx) -> RecordsPage:
            bound = before
            kept: list[RecordPlace] = []
            seqs = total = 0
            while True:
                after = "" if bound is None else f" AND {_PLACE} < (?, ?, ?)"
                rows = tx.execute(
                    f"""SELECT seq, intent_namespace, trace_sequence, LENGTH(record)
                        FROM effector_records WHERE {where}{after}
                        ORDER BY seq DESC, intent_namespace DESC, trace_sequence DESC LIMIT ?""",
                    (*params, *_place_params(bound), _PLACES_PER_READ),
                ).fetchall()
                for seq, stored_namespace, trace_sequence, size in rows:
                    new_run = not kept or kept[-1].seq != seq
                    over = total + size + RECORD_OVERHEAD_BYTES > max_bytes
                    if kept and ((new_run and seqs >= max_runs) or over):
                        return _read_page(tx, where, params, kept[-1], before, more=True)
                    kept.append(RecordPlace(int(seq), int(trace_sequence), str(stored_namespace)))
                    seqs, total = seqs + new_run, total + size + RECORD_OVERHEAD_BYTES
                if len(rows) < _PLACES_PER_READ:
                    if not kept:
                        return RecordsPage([], more=False)
                    return _read_page(tx, where, params, kept[-1], before, more=False)
                bound = kept[-1]

        return RecordsPage([], more=False) if max_runs <= 0 else await self._run(page, write=False)

    async def traces_for_key(self, entity_key: bytes, max_runs: int) -> list[TraceEvent]:
        """The events of the key's newest ``max_runs`` runs, by seq then sequence."""
        run = ("effector_traces", "event", "sequence, span_id")
        blobs = await self._newest_runs(*run, entity_key, max_runs, None)
        return [TraceEvent.FromString(blob) for blob in blobs]

    async def trace_runs(self, entity_key: bytes, max_runs: int) -> list[RunHead]:
        """The runs of the key's newest ``max_runs`` seqs (a run per trace), newest first."""

        def heads(tx: sql.Tx) -> list[RunHead]:
            seqs = tx.execute(
                """SELECT DISTINCT seq FROM effector_traces WHERE entity_key = ?
                   ORDER BY seq DESC LIMIT ?""",
                (entity_key, max_runs),
            ).fetchall()
            if not seqs:
                return []
            rows = tx.execute(
                """SELECT seq, trace_id, COUNT(*) FROM effector_traces
                   WHERE entity_key = ? AND seq >= ? GROUP BY seq, trace_id
                   ORDER BY seq DESC, trace_id""",
                (entity_key, seqs[-1][0]),
            ).fetchall()
            return [
                RunHead(int(seq), str(trace), int(count), _last_event(tx, entity_key, seq, trace))
                for seq, trace, count in rows
            ]

        return [] if max_runs <= 0 else await self._run(heads, write=False)

    async def trace_run(self, entity_key: bytes, trace_id: str) -> RunHead | None:
        """The key's run with this trace id, or ``None`` if none is stored."""

        def head(tx: sql.Tx) -> RunHead | None:
            row = tx.execute(
                """SELECT seq, COUNT(*) FROM effector_traces WHERE trace_id = ? AND entity_key = ?
                   GROUP BY seq ORDER BY seq DESC LIMIT 1""",
                (trace_id, entity_key),
            ).fetchone()
            if row is None:
                return None
            seq = int(row[0])
            return RunHead(seq, trace_id, int(row[1]), _last_event(tx, entity_key, seq, trace_id))

        return await self._run(head, write=False)

    async def run_spans(
        self, entity_key: bytes, head: RunHead, offset: int, limit: int
    ) -> list[TraceEvent]:
        """At most ``limit`` of a run's events in sequence order, from position ``offset``."""

        def spans(tx: sql.Tx) -> list[TraceEvent]:
            rows = tx.execute(
                """SELECT event FROM effector_traces
                   WHERE entity_key = ? AND seq = ? AND trace_id = ?
                   ORDER BY sequence, span_id LIMIT ? OFFSET ?""",
                (entity_key, head.seq, head.trace_id, limit, offset),
            ).fetchall()
            return [TraceEvent.FromString(bytes(blob)) for (blob,) in rows]

        return await self._run(spans, write=False)

    async def newest_events_of_types(
        self, entity_key: bytes, event_types: Sequence[int], limit: int
    ) -> list[TraceEvent]:
        """The key's newest ``limit`` events of the given types, newest first."""
        marks = ", ".join("?" * len(event_types))

        def newest(tx: sql.Tx) -> list[TraceEvent]:
            rows = tx.execute(
                f"""SELECT event FROM effector_traces
                    WHERE entity_key = ? AND event_type IN ({marks})
                    ORDER BY seq DESC, sequence DESC LIMIT ?""",
                (entity_key, *event_types, limit),
            ).fetchall()
            return [TraceEvent.FromString(bytes(blob)) for (blob,) in rows]

        return await self._run(newest, write=False)

    async def _newest_runs(
        self, table: str, column: str, order: str, key: bytes, runs: int, before: int | None
    ) -> list[bytes]:
        """``column`` of the key's newest ``runs`` runs in ``table``, by seq then ``order``."""
        bound, params = ("", ()) if before is None else (" AND seq < ?", (before,))

        def newest(tx: sql.Tx) -> list[bytes]:
            seqs = tx.execute(
                f"""SELECT DISTINCT seq FROM {table} WHERE entity_key = ?{bound}
                    ORDER BY seq DESC LIMIT ?""",
                (key, *params, runs),
            ).fetchall()
            if not seqs:
                return []
            rows = tx.execute(
                f"""SELECT {column} FROM {table} WHERE entity_key = ? AND seq >= ?{bound}
                    ORDER BY seq, {order}""",
                (key, seqs[-1][0], *params),
            ).fetchall()
            return [bytes(blob) for (blob,) in rows]

        return [] if runs <= 0 else await self._run(newest, write=False)

    async def list_keys(self, search: bytes, limit: int) -> list[KeySummary]:
        """Keys containing ``search`` (all if empty) among the :data:`KEY_SEARCH_SCAN` newest."""
        return await self._run(lambda tx: self._list_keys(tx, search, limit), write=False)

    def _list_keys(self, tx: sql.Tx, search: bytes, limit: int) -> list[KeySummary]:
        if not search:
            rows = tx.execute(
                f"{_KEY_SUMMARY.format(source='effector_key_activity')} {_NEWEST_KEYS} LIMIT ?",
                (limit,),
            ).fetchall()
        else:
            recent = f"(SELECT * FROM effector_key_activity AS a {_NEWEST_KEYS} LIMIT ?)"
            contains = self._dialect.contains_bytes.format(haystack="a.entity_key", needle="?")
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

    async def list_errors(self, entity_key: bytes | None, limit: int) -> list[ErrorRecord]:
        """Stored errors (of one key, if given), newest first, at most ``limit``."""
        where, params = (
            ("WHERE entity_key = ? ", (entity_key,)) if entity_key is not None else ("", ())
        )

        def listed(tx: sql.Tx) -> list[ErrorRecord]:
            rows = tx.execute(
                f"""SELECT {_ERROR_COLUMNS} FROM effector_errors {where}
                    ORDER BY recorded_at_ms DESC, error_id DESC LIMIT ?""",
                (*params, limit),
            ).fetchall()
            return [_error_record(row) for row in rows]

        return await self._run(listed, write=False)

    async def get_error(self, error_id: str) -> ErrorRecord | None:
        """One stored error, or ``None`` if it is unknown (or pruned)."""

        def found(tx: sql.Tx) -> ErrorRecord | None:
            row = tx.execute(
                f"SELECT {_ERROR_COLUMNS} FROM effector_errors WHERE error_id = ?", (error_id,)
            ).fetchone()
            return None if row is None else _error_record(row)

        return await self._run(found, write=False)

    async def mark_redriven(self, error_id: str, now_ms: int, *, again: bool = False) -> bool:
        """Claim an error for a re-drive (a second one only if ``again``); whether it did."""
        once = "" if again else " AND redriven_at_ms IS NULL"
        return await self._run(
            lambda tx: bool(
                tx.execute(
                    f"UPDATE effector_errors SET redriven_at_ms = ? WHERE error_id = ?{once}",
                    (now_ms, error_id),
                ).rowcount
            )
        )

    async def prune_telemetry(self, now_ms: int, retention_ms: int) -> int:
        """Forget telemetry stored before ``now_ms - retention_ms``; returns rows removed."""
        cutoff, removed = now_ms - retention_ms, 0
        while True:
            batch = await self._run(lambda tx: self._prune_telemetry(tx, cutoff))
            removed += batch
            if batch < sql.PRUNE_BATCH:
                return removed

    def _prune_telemetry(self, tx: sql.Tx, cutoff_ms: int) -> int:
        """Forget up to a batch of traces, errors, records and idle keys from before the cutoff."""
        idle = tx.execute(
            """SELECT entity_key FROM effector_key_activity WHERE last_seen_ms < ?
               ORDER BY last_seen_ms LIMIT ?""",
            (cutoff_ms, sql.PRUNE_BATCH),
        ).fetchall()
        gone = tx.execute(
            """DELETE FROM effector_traces WHERE (trace_id, span_id) IN (
                 SELECT trace_id, span_id FROM effector_traces WHERE recorded_at_ms < ?
                 ORDER BY recorded_at_ms LIMIT ?)
               RETURNING entity_key, seq, trace_id""",
            (cutoff_ms, sql.PRUNE_BATCH),
        ).fetchall()
        runs = sorted({(bytes(key), int(seq), str(trace)) for key, seq, trace in gone})
        idle_keys = sorted({bytes(key) for (key,) in idle})
        if self._dialect.for_update:  # SQLite needs no row locks: one writer at a time
            for chunk in sql.chunks(sorted({key for key, _, _ in runs}.union(idle_keys))):
                tx.execute(
                    f"""SELECT entity_key FROM effector_key_activity
                        WHERE entity_key IN ({sql.marks(len(chunk))})
                        ORDER BY entity_key{self._dialect.for_update}""",
                    chunk,
                ).fetchall()
        left = _events_by_run(tx, runs)
        emptied = Counter(run[0] for run in runs if not left[run])
        _add_runs(tx, Counter({key: -count for key, count in emptied.items()}))
        removed = len(gone)
        for chunk in sql.chunks(idle_keys):
            removed += tx.execute(
                f"""DELETE FROM effector_key_activity
                    WHERE entity_key IN ({sql.marks(len(chunk))})
                    AND runs = 0 AND last_seen_ms < ?""",
                (*chunk, cutoff_ms),
            ).rowcount
        removed += sql.delete_oldest(
            tx, "effector_errors", ["error_id"], "recorded_at_ms", cutoff_ms, sql.PRUNE_BATCH
        )
        identity = ["entity_key", "seq", "intent_namespace", "trace_sequence"]
        return removed + sql.delete_oldest(
            tx, "effector_records", identity, "recorded_at_ms", cutoff_ms, sql.PRUNE_BATCH
        )


# -- transaction steps --------------------------------------------------------------------------

_PLACE = "(seq, intent_namespace, trace_sequence)"


def _place_params(place: RecordPlace | None) -> tuple[Any, ...]:
    """A place as the parameters of a comparison with :data:`_PLACE` (none for no place)."""
    if place is None:
        return ()
    return (place.seq, sql.text(place.intent_namespace), place.trace_sequence)


def _read_page(
    tx: sql.Tx,
    where: str,
    params: Sequence[Any],
    oldest: RecordPlace,
    before: RecordPlace | None,
    *,
    more: bool,
) -> RecordsPage:
    """The records matching ``where`` from ``oldest`` up to (not including) ``before``."""
    upto = "" if before is None else f" AND {_PLACE} < (?, ?, ?)"
    rows = tx.execute(
        f"""SELECT record FROM effector_records WHERE {where} AND {_PLACE} >= (?, ?, ?){upto}
            ORDER BY seq, intent_namespace, trace_sequence""",
        (*params, *_place_params(oldest), *_place_params(before)),
    ).fetchall()
    return RecordsPage([ActivationRecord.FromString(bytes(blob)) for (blob,) in rows], more)


def _last_event(tx: sql.Tx, entity_key: bytes, seq: int, trace_id: str) -> int:
    """The type of a run's newest event (by its position in the run)."""
    row = tx.execute(
        """SELECT event_type FROM effector_traces
           WHERE entity_key = ? AND seq = ? AND trace_id = ?
           ORDER BY sequence DESC, span_id DESC LIMIT 1""",
        (entity_key, seq, trace_id),
    ).fetchone()
    return TraceEvent.EVENT_TYPE_UNSPECIFIED if row is None else int(row[0])


def _insert(
    tx: sql.Tx, table: str, columns: str, rows: Sequence[Sequence[Any]], returning: str
) -> tuple[Recorded, list[Any]]:
    """Insert ``rows`` (sorted), keeping rows already stored; counts, and ``returning`` of new."""
    width = columns.count(",") + 1
    inserted: list[Any] = []
    for chunk in sql.chunks(sorted(rows, key=lambda row: (row[0], row[1]))):
        inserted += tx.execute(
            f"INSERT INTO {table} ({columns}) VALUES {sql.row_marks(len(chunk), width)} "
            f"ON CONFLICT DO NOTHING RETURNING {returning}",
            sql.flatten(chunk),
        ).fetchall()
    return Recorded(recorded=len(inserted), duplicates=len(rows) - len(inserted)), inserted


def _touch_keys(tx: sql.Tx, keys: Iterable[bytes], now_ms: int) -> None:
    """Note that something about ``keys`` was recorded at ``now_ms``, locking their rows."""
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


_Run = tuple[bytes, int, str]
"""A run as the console lists it: ``(entity_key, seq, trace_id)``."""


def _events_by_run(tx: sql.Tx, runs: Sequence[_Run]) -> Counter[_Run]:
    """How many trace events each run of ``runs`` has stored (none: absent)."""
    stored: Counter[_Run] = Counter()
    for chunk in sql.chunks(runs, _RUNS_PER_STATEMENT):
        rows = tx.execute(
            f"""SELECT entity_key, seq, trace_id, COUNT(*) FROM effector_traces
                WHERE {" OR ".join(["(entity_key = ? AND seq = ? AND trace_id = ?)"] * len(chunk))}
                GROUP BY entity_key, seq, trace_id""",
            sql.flatten(chunk),
        ).fetchall()
        stored.update({(bytes(key), int(seq), str(trace)): int(n) for key, seq, trace, n in rows})
    return stored


def _add_runs(tx: sql.Tx, runs: Counter[bytes]) -> None:
    """Add ``runs[key]`` (negative: take away) to each key's run count."""
    changes = [(change, key) for key, change in sorted(runs.items()) if change]
    if changes:
        tx.executemany(
            "UPDATE effector_key_activity SET runs = runs + ? WHERE entity_key = ?", changes
        )


def _record_traces(tx: sql.Tx, events: Sequence[TraceEvent], now_ms: int) -> Recorded:
    """Store trace events; one already stored under ``(trace_id, span_id)`` is kept as it is.

    Key rows are locked before runs are counted, so concurrent calls count a run once.
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
    returning = "entity_key, seq, trace_id"
    recorded, inserted = _insert(tx, "effector_traces", _TRACE_COLUMNS, rows, returning)
    if not inserted:
        return recorded
    new: Counter[_Run] = Counter((bytes(key), int(seq), str(trace)) for key, seq, trace in inserted)
    _touch_keys(tx, {key for key, _, _ in new}, now_ms)
    stored = _events_by_run(tx, sorted(new))
    _add_runs(tx, Counter(run[0] for run, count in new.items() if stored[run] == count))
    return recorded
