"""Arguments are validated once: Submit's prepared call, kept by the worker, is what runs.

Only an intent the store recorded for the first time (ACCEPTED) keeps its call; one evicted, or
submitted before a restart, is validated again when it runs. The quick intake check agrees
with the full one.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from effector_harness import make_intent

import effector.worker as worker_module
from beam_agents._protos import (
    MAX_TIME_MS,
    MIN_TIME_MS,
    IntentState,
    SubmitAck,
    SubmitRequest,
    ToolIntent,
)
from beam_agents._protos.bounds import walked_recordable_problem
from beam_agents.tools import ToolRegistry, tool
from effector.observability import EffectorMetrics
from effector.service import EffectorService, intent_problem
from effector.store import open_store
from effector.store.intents import wall_clock_ms
from effector.store.sql import SqlStore
from effector.worker import EffectorToolRunner, Worker, WorkerSettings

received: list[int] = []


@tool(side_effect=True)
async def echo(x: int) -> int:
    """Note the argument it was called with."""
    received.append(x)
    return x


SETTINGS = WorkerSettings(concurrency=8, poll_interval_ms=20, housekeeping_interval_ms=60_000)


@pytest.fixture(autouse=True)
def _clear() -> None:
    received.clear()


@pytest.fixture
def prepared(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """How many times each intent's arguments were validated (``prepare_call``), by id."""
    counts: Counter[str] = Counter()
    real = worker_module.prepare_call

    def counted(registry: ToolRegistry, intent: ToolIntent) -> Any:
        counts[intent.intent_id] += 1
        return real(registry, intent)

    monkeypatch.setattr(worker_module, "prepare_call", counted)
    return counts


@asynccontextmanager
async def effector(path: Path) -> AsyncIterator[tuple[SqlStore, EffectorService]]:
    """A store and the service over it, with a worker that has not started."""
    store = await open_store(f"sqlite:///{path}")
    try:
        yield store, service_over(store)
    finally:
        await store.close()


def service_over(store: SqlStore) -> EffectorService:
    registry = ToolRegistry([echo])
    metrics = EffectorMetrics()
    worker = Worker(store, registry, EffectorToolRunner(), metrics, SETTINGS)
    return EffectorService(store, registry, worker, metrics, wall_clock_ms)


async def submit(service: EffectorService, intents: Sequence[ToolIntent]) -> list[SubmitAck]:
    response = await service.Submit(SubmitRequest(intents=intents), None)  # type: ignore[arg-type]
    return list(response.acks)


async def run_all(store: SqlStore, worker: Worker, intents: Sequence[ToolIntent]) -> None:
    """Start ``worker`` and wait until every intent is DONE, then drain it."""
    worker.start()
    deadline = time.monotonic() + 10
    try:
        for intent in intents:
            while True:
                record = await store.get_intent(intent.intent_id)
                if record is not None and record.state == IntentState.DONE:
                    break
                assert time.monotonic() < deadline, f"{intent.intent_id} not DONE"
                await asyncio.sleep(0.01)
    finally:
        await worker.drain(5.0)


def echoes(count: int) -> list[ToolIntent]:
    return [make_intent("echo", {"x": n}, key=f"k{n}".encode()) for n in range(count)]


@pytest.mark.asyncio
async def test_submit_validates_and_execution_does_not_again(
    tmp_path: Path, prepared: Counter[str]
) -> None:
    intents = echoes(3)
    async with effector(tmp_path / "e.db") as (store, service):
        acks = await submit(service, intents)
        assert [ack.outcome for ack in acks] == [SubmitAck.ACCEPTED] * 3
        await run_all(store, service.worker, intents)
    assert sorted(received) == [0, 1, 2]
    assert prepared == {intent.intent_id: 1 for intent in intents}


@pytest.mark.parametrize("bound", ["count", "bytes"])
@pytest.mark.asyncio
async def test_an_evicted_intent_is_validated_again(
    tmp_path: Path, prepared: Counter[str], monkeypatch: pytest.MonkeyPatch, bound: str
) -> None:
    intents = echoes(4)
    if bound == "count":
        monkeypatch.setattr(worker_module, "VALIDATED_CALLS_KEPT", 2)
    else:  # two intents' argument JSON
        monkeypatch.setattr(
            worker_module, "VALIDATED_ARGS_BYTES_KEPT", 2 * len(intents[0].args_json)
        )
    async with effector(tmp_path / "e.db") as (store, service):
        for intent in intents:  # one by one: the oldest are let go first
            await submit(service, [intent])
        await run_all(store, service.worker, intents)
    assert sorted(received) == [0, 1, 2, 3]
    assert [prepared[intent.intent_id] for intent in intents] == [2, 2, 1, 1]


@pytest.mark.asyncio
async def test_an_intent_with_large_arguments_is_not_kept(
    tmp_path: Path, prepared: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker_module, "VALIDATED_ARGS_BYTES_EACH", 7)
    small = make_intent("echo", {"x": 1}, key=b"small")
    large = make_intent("echo", {"x": 10**9}, key=b"large")
    assert len(small.args_json) <= 7 < len(large.args_json)
    async with effector(tmp_path / "e.db") as (store, service):
        await submit(service, [small, large])
        await run_all(store, service.worker, [small, large])
    assert sorted(received) == [1, 10**9]
    assert prepared == {small.intent_id: 1, large.intent_id: 2}


@pytest.mark.asyncio
async def test_an_intent_submitted_before_a_restart_is_validated_again(
    tmp_path: Path, prepared: Counter[str]
) -> None:
    intents = echoes(2)
    async with effector(tmp_path / "e.db") as (store, service):
        await submit(service, intents)
        restarted = service_over(store)  # a new worker: what the old one kept is gone
        await run_all(store, restarted.worker, intents)
    assert sorted(received) == [0, 1]
    assert prepared == {intent.intent_id: 2 for intent in intents}


@pytest.mark.asyncio
async def test_a_conflicting_resubmission_runs_the_recorded_arguments(
    tmp_path: Path, prepared: Counter[str]
) -> None:
    recorded = make_intent("echo", {"x": 1})
    conflicting = make_intent("echo", {"x": 2})
    assert conflicting.intent_id == recorded.intent_id
    async with effector(tmp_path / "e.db") as (store, service):
        first = await submit(service, [recorded])
        second = await submit(service, [conflicting])
        both = await submit(service, [make_intent("echo", {"x": 3}, key=b"other")] * 2)
        await run_all(store, service.worker, [recorded])
    assert first[0].outcome == SubmitAck.ACCEPTED
    assert second[0].outcome == SubmitAck.REJECTED and "conflict" in second[0].reason
    assert [ack.outcome for ack in both] == [SubmitAck.ACCEPTED, SubmitAck.DUPLICATE]
    assert sorted(received) == [1, 3]


DEEP_ARGS = '{"a":' + "[" * 64 + "]" * 64 + "}"
WIDE_ARGS = '{"a":[' + ",".join(["[]"] * 100) + "]}"


def intent_with(**fields: Any) -> ToolIntent:
    intent = make_intent("echo", {"x": 1})
    for name, value in fields.items():
        if name == "edited_from":
            intent.edited_from.diff_json = value
        else:
            setattr(intent, name, value)
    return intent


INTAKE_CASES = {
    "usual": intent_with(),
    "empty key": intent_with(entity_key=b""),
    "long key": intent_with(entity_key=b"k" * 5_000),
    "long tool name": intent_with(tool_name="t" * 5_000),
    "early time": intent_with(created_at_ms=MIN_TIME_MS - 1),
    "late expiry": intent_with(expires_at_ms=MAX_TIME_MS + 1),
    "deep arguments": intent_with(args_json=DEEP_ARGS),
    "wide arguments": intent_with(args_json=WIDE_ARGS),
    "deep compensation": intent_with(compensate_args_json=DEEP_ARGS),
    "deep edit": intent_with(edited_from=DEEP_ARGS),
    "shallow edit": intent_with(edited_from="{}"),
}


@pytest.mark.parametrize("case", sorted(INTAKE_CASES))
def test_the_quick_intake_check_agrees_with_the_full_one(case: str) -> None:
    intent = INTAKE_CASES[case]
    full = walked_recordable_problem(intent)
    expected = None if full is None else f"intent {intent.intent_id} {full}"
    assert intent_problem(intent) == expected
    usual = case in {"usual", "wide arguments", "shallow edit"}
    assert (expected is None) == usual, expected
