"""The activation-records half of the conformance suite: stored once, read back by run, pruned.

Runs against every store backend (SQLite and PostgreSQL) with time passed in, like
``test_store_telemetry.py``.
"""

from __future__ import annotations

import pytest

import effector.store.schema as schema
from beam_agents._protos import ActivationRecord, AgentEnvelope
from effector.store.sql import SqlStore
from effector.store.telemetry import RECORD_OVERHEAD_BYTES, RecordPlace

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


async def walk(
    store: SqlStore, key: bytes, max_runs: int, max_bytes: int, namespace: str | None = None
) -> list[list[ActivationRecord]]:
    """Every page of ``key``'s records, newest first, following each page's place."""
    pages: list[list[ActivationRecord]] = []
    before: RecordPlace | None = None
    while True:
        page = await store.records_before(
            key, max_runs, max_bytes, before=before, namespace=namespace
        )
        pages.append(page.records)
        if not page.more:
            return pages
        assert page.records, "a page that makes no progress"
        oldest = page.records[0]
        before = RecordPlace(oldest.seq, oldest.trace_sequence, oldest.intent_namespace)


def size(records: list[ActivationRecord]) -> int:
    return sum(r.ByteSize() + RECORD_OVERHEAD_BYTES for r in records)


@pytest.mark.asyncio
async def test_a_run_too_large_for_one_page_is_split_and_every_page_makes_progress(
    store: SqlStore,
) -> None:
    big = [record(b"k", 3, position, output=b"x" * 1_000) for position in range(7)]
    small = [record(b"k", seq) for seq in range(3)]
    await store.record_activations([*small, *big], T0)
    pages = await walk(store, b"k", 10, 2_500)
    assert [len(page) for page in pages] == [2, 2, 2, 4]  # the last: a big one, 3 small runs
    assert all(size(page) <= 2_500 for page in pages)
    assert [r for page in reversed(pages) for r in page] == [*small, *big]
    lone = await walk(store, b"k", 10, 10)  # nothing fits: one record a page, still progress
    assert [r for page in reversed(lone) for r in page] == [*small, *big]
    assert all(len(page) == 1 for page in lone)
    by_runs = await walk(store, b"k", 2, 1_000_000)
    assert by_runs == [[small[2], *big], small[:2]]


@pytest.mark.asyncio
async def test_a_page_holds_one_namespace_when_asked_and_orders_namespaces_apart(
    store: SqlStore,
) -> None:
    default = [record(b"k", 0, position) for position in range(3)]
    other = [record(b"k", 0, position) for position in range(2)]
    for item in other:
        item.intent_namespace = "v2"
        item.output = b"v2"
    await store.record_activations([*other, *default], T0)
    assert await walk(store, b"k", 10, 10_000, namespace="v2") == [other]
    assert await walk(store, b"k", 10, 10_000, namespace="") == [default]
    assert await walk(store, b"k", 10, 10_000) == [[*default, *other]]
    split = await walk(store, b"k", 10, size(default[:2]) + 1)
    assert [r for page in reversed(split) for r in page] == [*default, *other]
    assert await walk(store, b"k", 10, 10_000, namespace="v3") == [[]]
