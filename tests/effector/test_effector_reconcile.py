"""Reconcile before re-executing, end to end in one effector: found, not found, failed.

Each test leaves an intent as a crashed effector would (claimed, no result recorded), then
starts an effector on the same SQLite store, which gives the stale claim back and claims the
intent again: the tool's reconciler is asked before anything executes again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest
from effector_harness import make_intent, running_effector

from beam_agents._protos import (
    GetIntentResponse,
    IntentState,
    StatusResponse,
    ToolIntent,
    ToolResult,
    canonical_json_bytes,
)
from beam_agents.tools import IntentInfo, Reconciled, ToolRegistry, tool
from effector.client import AsyncEffectorClient
from effector.server import ServerSettings
from effector.store import open_store
from effector.store.intents import NewIntent, wall_clock_ms
from effector.worker import WorkerSettings, retry_delay_ms


class Outside:
    """The outside system the test tools act on, and what their reconcilers answer."""

    calls: ClassVar[list[str]] = []
    found: ClassVar[dict[str, object]] = {}
    failing: ClassVar[str | None] = None
    """Set: the reconcilers raise this message (or, ``"hang"``, outlast the timeout)."""
    asked: ClassVar[list[tuple[str, int, dict[str, Any]]]] = []


@tool(side_effect=True)
def pay(amount: int, *, intent: IntentInfo) -> dict[str, object]:
    """Pay.

    Args:
        amount: Cents.
    """
    Outside.calls.append(intent.intent_id)
    return {"paid": amount}


@pay.reconciler
def find_payment(intent: IntentInfo, args: dict[str, Any]) -> Reconciled | None:
    """Look the intent id up in the outside system."""
    Outside.asked.append((intent.intent_id, intent.attempt, args))
    if Outside.failing == "hang":
        time.sleep(2.5)
    elif Outside.failing is not None:
        raise ConnectionError(Outside.failing)
    if intent.intent_id in Outside.found:
        return Reconciled(Outside.found[intent.intent_id])
    return None


@tool(side_effect=True)
async def notify(text: str) -> str:
    """Notify.

    Args:
        text: What.
    """
    Outside.calls.append(text)
    return text


@notify.reconciler
async def find_notification(intent: IntentInfo, args: dict[str, Any]) -> Reconciled | None:
    """Async: found when the text was sent."""
    await asyncio.sleep(0)
    return Reconciled(args["text"]) if args["text"] in Outside.found else None


@tool(side_effect=True)
def plain(x: int) -> int:
    """No reconciler: re-executed as before.

    Args:
        x: A number.
    """
    Outside.calls.append(f"plain:{x}")
    return x


REGISTRY = ToolRegistry([pay, notify, plain])
SETTINGS = ServerSettings(
    worker=WorkerSettings(poll_interval_ms=20, housekeeping_interval_ms=50, lease_ms=30_000),
    tool_timeout_ms=1_000,
)


@pytest.fixture(autouse=True)
def outside() -> None:
    Outside.calls, Outside.found, Outside.failing, Outside.asked = [], {}, None, []


async def crashed_with(store_url: str, *intents: ToolIntent) -> None:
    """Record ``intents`` and claim each once, as an effector killed mid-execution leaves them."""
    store = await open_store(store_url)
    try:
        now = wall_clock_ms()
        await store.submit([NewIntent(intent) for intent in intents], now)
        claimed = (await store.claim("crashed", len(intents), now, 30_000)).claims
        assert len(claimed) == len({intent.entity_key for intent in intents})
    finally:
        await store.close()


async def until(
    client: AsyncEffectorClient, intent_id: str, *states: IntentState
) -> GetIntentResponse:
    deadline = time.monotonic() + 10
    while (response := await client.get_intent(intent_id)).state not in states:
        assert time.monotonic() < deadline, response
        await asyncio.sleep(0.02)
    return response


def counted(server: Any, outcome: str) -> float:
    value = server.metrics.registry.get_sample_value(
        "effector_reconciliations_total", {"outcome": outcome}
    )
    return value or 0.0


@pytest.mark.asyncio
async def test_a_found_effect_is_recorded_without_executing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    paid = make_intent("pay", {"amount": 5}, key=b"a")
    sent = make_intent("notify", {"text": "hi"}, key=b"b")
    await crashed_with(url, paid, sent)
    Outside.found = {paid.intent_id: {"paid": 5, "receipt": "r-1"}, "hi": None}
    caplog.set_level(logging.INFO, logger="effector.audit")
    async with running_effector(url, REGISTRY, SETTINGS) as effector:
        response = await until(effector.client, paid.intent_id, IntentState.DONE)
        await until(effector.client, sent.intent_id, IntentState.DONE)
        assert response.result.status == ToolResult.OK
        assert response.result.payload == canonical_json_bytes({"paid": 5, "receipt": "r-1"})
        assert (response.result.attempt, response.attempts) == (2, 2)
        assert Outside.calls == []
        assert Outside.asked == [(paid.intent_id, 2, {"amount": 5})]
        assert counted(effector.server, "found") == 2
    assert any("RECONCILED" in r.message and paid.intent_id in r.message for r in caplog.records)


@pytest.mark.asyncio
async def test_a_started_intent_past_its_deadline_is_reconciled_not_expired(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    created = wall_clock_ms() - 60_000  # its TTL ran out while the effector was down
    done = make_intent("pay", {"amount": 5}, key=b"a", ttl_ms=1_000, created_at_ms=created)
    lost = make_intent("pay", {"amount": 6}, key=b"b", ttl_ms=1_000, created_at_ms=created)
    store = await open_store(url)
    try:  # recorded and claimed while still alive, as a crashed effector leaves them
        await store.submit([NewIntent(i) for i in (done, lost)], created + 10)
        assert len((await store.claim("crashed", 2, created + 20, 30_000)).claims) == 2
    finally:
        await store.close()
    Outside.found = {done.intent_id: {"paid": 5}}
    async with running_effector(url, REGISTRY, SETTINGS) as effector:
        found = await until(effector.client, done.intent_id, IntentState.DONE)
        missing = await until(effector.client, lost.intent_id, IntentState.DONE)
    assert found.result.status == ToolResult.OK  # it happened: not EXPIRED
    assert found.result.payload == canonical_json_bytes({"paid": 5})
    assert missing.result.status == ToolResult.EXPIRED  # not found, and too late to run
    assert Outside.calls == []
    assert sorted(asked[0] for asked in Outside.asked) == sorted([done.intent_id, lost.intent_id])


@pytest.mark.asyncio
async def test_an_effect_not_found_is_executed_and_a_first_attempt_is_never_reconciled(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    again = make_intent("pay", {"amount": 7}, key=b"a")
    unreconcilable = make_intent("plain", {"x": 1}, key=b"c")
    await crashed_with(url, again, unreconcilable)
    async with running_effector(url, REGISTRY, SETTINGS) as effector:
        fresh = make_intent("pay", {"amount": 9}, key=b"b")
        await effector.client.submit([fresh])
        for intent in (again, unreconcilable, fresh):
            response = await until(effector.client, intent.intent_id, IntentState.DONE)
            assert response.result.status == ToolResult.OK
        assert sorted(Outside.calls) == sorted([again.intent_id, "plain:1", fresh.intent_id])
        assert [asked[0] for asked in Outside.asked] == [again.intent_id]
        assert (counted(effector.server, "not_found"), counted(effector.server, "found")) == (1, 0)


@pytest.mark.parametrize("failure", ["down", "hang"])
@pytest.mark.asyncio
async def test_a_failing_reconciler_leaves_the_intent_in_doubt_and_its_key_held(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, failure: str
) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    doubtful = make_intent("pay", {"amount": 5}, key=b"k", seq=0)
    behind = make_intent("pay", {"amount": 6}, key=b"k", seq=1)
    await crashed_with(url, doubtful)
    Outside.failing = failure
    caplog.set_level(logging.WARNING, logger="effector.audit")
    async with running_effector(url, REGISTRY, SETTINGS) as effector:
        await effector.client.submit([behind])
        started = wall_clock_ms()
        response = await until(effector.client, doubtful.intent_id, IntentState.IN_DOUBT)
        expected = "ConnectionError: down" if failure == "down" else "did not finish within"
        assert expected in response.in_doubt_reason
        assert started < response.retry_at_ms <= wall_clock_ms() + retry_delay_ms(1)
        assert not response.HasField("result")
        await asyncio.sleep(0.3)
        assert Outside.calls == []  # neither the intent nor the one behind it ran
        assert (await effector.client.get_intent(behind.intent_id)).state == IntentState.PENDING
        assert counted(effector.server, "failed") >= 1
        gauge = effector.server.metrics.registry.get_sample_value("effector_intents_in_doubt")
        assert gauge == 1
        listed = await effector.client.list_intents(IntentState.IN_DOUBT)
        assert [i.intent_id for i in listed] == [doubtful.intent_id]

        # The reconciler answers again after the backoff: found, so nothing ran twice.
        Outside.failing = None
        Outside.found = {doubtful.intent_id: {"paid": 5}}
        response = await until(effector.client, doubtful.intent_id, IntentState.DONE)
        assert response.result.payload == b'{"paid":5}' and response.in_doubt_reason == ""
        await until(effector.client, behind.intent_id, IntentState.DONE)
        assert Outside.calls == [behind.intent_id]
    assert any("IN_DOUBT" in r.message and doubtful.intent_id in r.message for r in caplog.records)


def test_the_backoff_doubles_from_a_second_to_five_minutes() -> None:
    assert [retry_delay_ms(n) for n in (1, 2, 3, 4)] == [1_000, 2_000, 4_000, 8_000]
    assert retry_delay_ms(9) == 256_000 and retry_delay_ms(10) == retry_delay_ms(99) == 300_000


def test_the_in_doubt_wire_fields_have_fixed_bytes() -> None:
    response = GetIntentResponse(
        found=True, state=IntentState.IN_DOUBT, in_doubt_reason="x", retry_at_ms=1_000
    )
    assert response.SerializeToString() == bytes.fromhex("0801100532017838e807")
    assert IntentState.IN_DOUBT == 5 and IntentState.Name(5) == "IN_DOUBT"
    status = StatusResponse(pending=1, in_flight=2, in_doubt=1)
    assert status.SerializeToString() == bytes.fromhex("080130023801")
