"""The activation-records half of the conformance suite: stored once, read back by run, pruned.

Runs against every store backend (SQLite and PostgreSQL) with time passed in, like
``test_store_telemetry.py``.
"""

from __future__ import annotations

import pytest

import effector.store.schema as schema
from beam_agents._protos import ActivationRecord, AgentEnvelope
from effector.service import records_page
from effector.store.sql import SqlStore

T0 = 1_700_000_020_000


def record(key: bytes, seq: int, position: int = 0, output: bytes = b"done") -> ActivationRecord:
    """A record of one activation: the ``position``-th of run ``seq`` of ``key``."""
    trigger = "event" if position == 0 else "tool_result"
    return ActivationRecord(
        schema_version=1,
        entity_key=key,
        seq=seq,
        trigger=trigger,
        trace_sequence=position * 5,
        envelope=AgentEnvelope(entity_key=key, external_event=b"e%d" % seq),
        outcome=ActivationRecord.COMPLETE,
        output=output,
    )


@pytest.mark.asyncio
async def test_records_are_stored_once_per_place_in_their_keys_history(
    store: SqlStore,
) -> None:
    first = [record(b"k", 0), record(b"k", 0, 1), record(b"k", 1)]
    stored = await store.record_activations([*first, first[0]], T0)
    assert (stored.recorded, stored.duplicates) == (3, 1)
    rerun = [record(b"k", 0, output=b"other"), record(b"k", 2), record(b"j", 0)]
    stored = await store.record_activations(rerun, T0 + 1)
    assert (stored.recorded, stored.duplicates) == (2, 1)
    assert await store.records_for_key(b"k", 10) == [*first, record(b"k", 2)]
    assert await store.records_for_key(b"j", 10) == [record(b"j", 0)]
    assert await store.records_for_key(b"nobody", 10) == []


@pytest.mark.asyncio
async def test_records_for_key_pages_whole_runs_newest_first_each_in_order(
    store: SqlStore,
) -> None:
    runs = {seq: [record(b"k", seq, n) for n in range(seq % 3 + 1)] for seq in range(6)}
    shuffled = [r for seq in (3, 0, 5, 1, 4, 2) for r in reversed(runs[seq])]
    await store.record_activations(shuffled, T0)

    def of(*seqs: int) -> list[ActivationRecord]:
        return [r for seq in seqs for r in runs[seq]]

    assert await store.records_for_key(b"k", 2) == of(4, 5)
    assert await store.records_for_key(b"k", 2, before_seq=4) == of(2, 3)
    assert await store.records_for_key(b"k", 9, before_seq=2) == of(0, 1)
    assert await store.records_for_key(b"k", 9, before_seq=0) == []
    assert await store.records_for_key(b"k", 0) == []
    assert await store.records_for_key(b"k", 100) == of(*range(6))


@pytest.mark.asyncio
async def test_records_are_pruned_with_the_telemetry(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(schema, "PRUNE_BATCH", 2)  # pruning takes several transactions
    await store.record_activations([record(b"old", seq) for seq in range(5)], T0)
    await store.record_activations([record(b"new", 0)], T0 + 1_000)
    assert await store.prune_telemetry(T0 + 1_500, 1_000) == 5
    assert await store.records_for_key(b"old", 10) == []
    assert await store.records_for_key(b"new", 10) == [record(b"new", 0)]
    assert await store.prune_telemetry(T0 + 1_500, 1_000) == 0
    assert (await store.record_activations([record(b"old", 0)], T0 + 2_000)).recorded == 1


def test_a_page_leaves_its_oldest_runs_for_the_next_when_it_is_too_large() -> None:
    big = [record(b"k", seq, output=b"x" * 1_000) for seq in range(4)]
    assert records_page(big, 10, 10_000) == (big, 0)
    assert records_page(big, 4, 10_000) == (big, 0)  # seq 0 is the oldest: nothing before
    assert records_page(big[1:], 3, 10_000) == (big[1:], 1)  # a full page: maybe more
    assert records_page(big, 10, 2_500) == (big[2:], 2)
    assert records_page(big, 10, 10) == (big[3:], 3)  # the newest run always stays
    assert records_page([], 10, 10) == ([], 0)
