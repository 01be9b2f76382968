"""Activation records: the pipeline's ``.records``, stored for ``beam-agents replay``.

A record is stored once under its place in its key's history, ``(entity_key, seq,
trace_sequence)`` (its run, and where its activation started in the run): what a retried
bundle or a replayed pipeline reproduces, so they store nothing new. Records are read back a
key's newest runs at a time and forgotten with the telemetry (``prune_telemetry``). The table
is described in ``effector/README.md``, "Telemetry tables".
"""

from __future__ import annotations

from collections.abc import Sequence

import effector.store._tx as sql
from beam_agents._protos import ActivationRecord
from effector.store.base import Recorded

_COLUMNS = "entity_key, seq, trace_sequence, record, recorded_at_ms"


def records_statements(dialect: sql.Dialect) -> list[str]:
    """The DDL of the records table and its index, idempotently."""
    blob, bigint = dialect.blob, dialect.bigint
    return [
        f"""CREATE TABLE IF NOT EXISTS effector_records (
            entity_key {blob} NOT NULL,
            seq {bigint} NOT NULL,
            trace_sequence INTEGER NOT NULL,
            record {blob} NOT NULL,
            recorded_at_ms {bigint} NOT NULL,
            PRIMARY KEY (entity_key, seq, trace_sequence))""",
        """CREATE INDEX IF NOT EXISTS effector_records_age
            ON effector_records (recorded_at_ms)""",
    ]


def record_activations(tx: sql.Tx, records: Sequence[ActivationRecord], now_ms: int) -> Recorded:
    """Store records; one already stored at the same place is kept as it is."""
    rows = sorted(
        (
            record.entity_key,
            record.seq,
            record.trace_sequence,
            record.SerializeToString(deterministic=True),
            now_ms,
        )
        for record in records
    )  # by the whole identity: concurrent writers lock rows in the same order
    recorded = 0
    for chunk in sql.chunks(rows):
        recorded += tx.execute(
            f"INSERT INTO effector_records ({_COLUMNS}) VALUES {sql.row_marks(len(chunk), 5)} "
            "ON CONFLICT DO NOTHING",
            sql.flatten(chunk),
        ).rowcount
    return Recorded(recorded=recorded, duplicates=len(rows) - recorded)


def records_for_key(
    tx: sql.Tx, entity_key: bytes, max_runs: int, before_seq: int | None
) -> list[ActivationRecord]:
    """The records of the key's newest ``max_runs`` runs (before ``before_seq``), in order."""
    if max_runs <= 0:
        return []
    bound, params = ("", ()) if before_seq is None else (" AND seq < ?", (before_seq,))
    newest = tx.execute(
        f"""SELECT DISTINCT seq FROM effector_records WHERE entity_key = ?{bound}
            ORDER BY seq DESC LIMIT ?""",
        (entity_key, *params, max_runs),
    ).fetchall()
    if not newest:
        return []
    rows = tx.execute(
        f"""SELECT record FROM effector_records WHERE entity_key = ? AND seq >= ?{bound}
            ORDER BY seq, trace_sequence""",
        (entity_key, newest[-1][0], *params),
    ).fetchall()
    return [ActivationRecord.FromString(bytes(blob)) for (blob,) in rows]


def prune_records(tx: sql.Tx, cutoff_ms: int, batch: int) -> int:
    """Forget up to ``batch`` records stored before ``cutoff_ms``."""
    identity = ["entity_key", "seq", "trace_sequence"]
    return sql.delete_oldest(tx, "effector_records", identity, "recorded_at_ms", cutoff_ms, batch)
