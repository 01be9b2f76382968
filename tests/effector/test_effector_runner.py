"""EffectorToolRunner: the sanctioned executor of side-effecting tools, and result mapping."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from effector_harness import make_intent
from effector_test_tools import make_registry

from beam_agents._protos import ToolIntent, ToolResult
from beam_agents.tools import IntentInfo, ToolRegistry, tool
from beam_agents.tools.errors import ToolArgumentError
from effector import EffectorToolRunner
from effector.worker import (
    MAX_RESULT_PAYLOAD_BYTES,
    ToolRefusedError,
    ToolTimeoutError,
    intake_rejection,
)

INFO = IntentInfo(intent_id="i-1", entity_key=b"k", seq=3, step_index=1, attempt=2)
calls: list[str] = []


@tool(side_effect=True)
def charge(amount: int, *, intent: IntentInfo) -> dict[str, object]:
    """Charge an amount, keyed by the intent id."""
    calls.append(f"charge:{amount}")
    return {"amount": amount, "key": intent.intent_id, "attempt": intent.attempt}


@tool
def peek(name: str) -> str:
    """Read-only."""
    calls.append(f"peek:{name}")
    return name


@tool(side_effect=True)
def sleepy(seconds: float) -> str:
    """Block the calling thread."""
    time.sleep(seconds)
    return "woke"


@tool(side_effect=True)
async def async_sleepy(seconds: float) -> str:
    """Sleep on the loop."""
    await asyncio.sleep(seconds)
    return "woke"


@tool(side_effect=True)
def raises_timeout() -> None:
    """Raise TimeoutError of its own (not the runner's timeout)."""
    raise TimeoutError("upstream timed out")


@pytest.fixture(autouse=True)
def _clear_calls() -> None:
    calls.clear()


@pytest.mark.asyncio
async def test_runs_a_side_effecting_tool_with_coerced_arguments_and_intent() -> None:
    result = await EffectorToolRunner().run(charge, {"amount": "5"}, INFO)
    assert result == {"amount": 5, "key": "i-1", "attempt": 2}
    assert calls == ["charge:5"]


@pytest.mark.asyncio
async def test_refuses_a_read_only_tool_without_invoking_it() -> None:
    with pytest.raises(ToolRefusedError, match="read-only"):
        await EffectorToolRunner().run(peek, {"name": "x"})
    assert calls == []


@pytest.mark.asyncio
async def test_invalid_arguments_never_invoke_the_tool() -> None:
    runner = EffectorToolRunner()
    with pytest.raises(ToolArgumentError):
        await runner.run(charge, {"amount": "many"}, INFO)
    with pytest.raises(ToolArgumentError):
        await runner.run(charge, {"amount": 1, "intent": {"intent_id": "spoofed"}}, INFO)
    assert calls == []


@pytest.mark.asyncio
async def test_a_tool_that_declares_intent_needs_intent_info() -> None:
    with pytest.raises(ToolRefusedError, match="intent_info"):
        await EffectorToolRunner().run(charge, {"amount": 1})
    assert calls == []


@pytest.mark.asyncio
async def test_timeouts_apply_to_sync_and_async_tools() -> None:
    runner = EffectorToolRunner(tool_timeout_ms=100)
    for slow_tool in (sleepy, async_sleepy):
        started = time.monotonic()
        with pytest.raises(ToolTimeoutError, match="100 ms"):
            await runner.run(slow_tool, {"seconds": 2})
        assert time.monotonic() - started < 1.5
    # A TimeoutError the tool raises itself is the tool's failure, not the runner's timeout.
    with pytest.raises(TimeoutError) as raised:
        await runner.run(raises_timeout, {})
    assert not isinstance(raised.value, ToolTimeoutError)


@pytest.mark.asyncio
async def test_a_blocking_sync_tool_does_not_block_the_event_loop() -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticking = asyncio.create_task(ticker())
    assert await EffectorToolRunner().run(sleepy, {"seconds": 0.3}) == "woke"
    ticking.cancel()
    assert ticks >= 10


@pytest.mark.parametrize("bad", [0, -5, True])
def test_the_timeout_must_be_a_positive_int(bad: int) -> None:
    with pytest.raises((ValueError, TypeError)):
        EffectorToolRunner(tool_timeout_ms=bad)


async def _execute(
    intent: ToolIntent, registry: ToolRegistry | None = None, timeout_ms: int = 30_000
) -> ToolResult:
    runner = EffectorToolRunner(tool_timeout_ms=timeout_ms)
    return await runner.execute(registry or make_registry(), intent, attempt=1, clock=lambda: 1234)


@pytest.mark.asyncio
async def test_execute_maps_every_outcome_to_a_status(ledger: object) -> None:
    ok = await _execute(make_intent("add", {"a": 2, "b": "3"}))
    assert (ok.status, ok.payload, ok.attempt, ok.completed_at_ms) == (ToolResult.OK, b"5", 1, 1234)
    none = await _execute(make_intent("noop"))
    assert (none.status, none.payload) == (ToolResult.OK, b"null")
    raised = await _execute(make_intent("fail", {"message": "boom"}))
    assert (raised.status, raised.error_message) == (ToolResult.ERROR, "RuntimeError: boom")
    timed_out = await _execute(make_intent("slow", {"seconds": 2}), timeout_ms=50)
    assert timed_out.status == ToolResult.ERROR
    assert "did not finish within 50 ms" in timed_out.error_message
    not_json = await _execute(make_intent("not_json"))
    assert not_json.status == ToolResult.ERROR
    assert "not JSON-encodable" in not_json.error_message
    largest = await _execute(make_intent("huge", {"size": MAX_RESULT_PAYLOAD_BYTES - 2}))
    assert (largest.status, len(largest.payload)) == (ToolResult.OK, MAX_RESULT_PAYLOAD_BYTES)
    too_big = await _execute(make_intent("huge", {"size": 9 * 1024 * 1024}))
    assert (too_big.status, too_big.payload) == (ToolResult.ERROR, b"")
    assert "over the cap" in too_big.error_message and "9437186 bytes" in too_big.error_message
    exits = await _execute(make_intent("exits"))
    assert (exits.status, exits.error_message) == (ToolResult.ERROR, "SystemExit: 3")
    recorded = await _execute(make_intent("record", {"note": "n"}, key=b"kk", seq=7, step=2))
    assert recorded.status == ToolResult.OK
    assert json.loads(recorded.payload) == {
        "note": "n",
        "intent_id": make_intent("record", key=b"kk", seq=7, step=2).intent_id,
        "attempt": 1,
    }
    assert (recorded.entity_key, recorded.seq) == (b"kk", 7)


REJECTIONS = {
    "unknown tool": (make_intent("missing"), "unknown tool 'missing'"),
    "read-only tool": (make_intent("lookup", {"name": "x"}), "read-only"),
    "bad JSON": (make_intent("add", "{not json"), "is not JSON"),
    "not an object": (make_intent("add", "[1, 2]"), "must be a JSON object"),
    "missing argument": (make_intent("add", {"b": 1}), "a"),
    "wrong type": (make_intent("add", {"a": "many"}), "a"),
    "spoofed intent": (
        make_intent("record", {"note": "x", "intent": {"intent_id": "x"}}),
        "intent",
    ),
}


@pytest.mark.asyncio
@pytest.mark.parametrize("case", sorted(REJECTIONS))
async def test_execute_rejects_what_cannot_run_and_never_runs_it(case: str, ledger: object) -> None:
    intent, reason = REJECTIONS[case]
    result = await _execute(intent)
    assert result.status == ToolResult.REJECTED
    assert reason in result.error_message
    assert result.attempt == 0
    assert intake_rejection(make_registry(), intent) == result.error_message


def test_intake_rejection_covers_kind_and_expiry() -> None:
    registry = make_registry()
    assert intake_rejection(registry, make_intent("add", {"a": 1})) is None
    unknown_kind = make_intent("add", {"a": 1})
    unknown_kind.kind = 7  # type: ignore[assignment]
    assert intake_rejection(registry, unknown_kind) == "unknown intent kind 7"
    backwards = make_intent("add", {"a": 1}, created_at_ms=1_000)
    backwards.expires_at_ms = 500
    reason = intake_rejection(registry, backwards)
    assert reason is not None and "precedes created_at_ms" in reason
    approval = make_intent("", "{oops", kind=ToolIntent.APPROVAL)
    reason = intake_rejection(registry, approval)
    assert reason is not None and "not JSON" in reason
    assert intake_rejection(registry, make_intent("", "", kind=ToolIntent.APPROVAL)) is None


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("kind", [ToolIntent.TOOL, ToolIntent.APPROVAL])
def test_arguments_too_deep_to_decode_are_a_rejection_not_a_crash(kind: ToolIntent.Kind) -> None:
    intent = make_intent("add", DEEP, kind=kind)
    reason = intake_rejection(make_registry(), intent)
    assert reason is not None and "nests too deeply" in reason


@pytest.mark.asyncio
async def test_executing_arguments_too_deep_to_decode_records_a_rejection() -> None:
    intent = make_intent("add", '{"a":' + DEEP + "}")
    result = await EffectorToolRunner().execute(make_registry(), intent, attempt=1, clock=lambda: 5)
    assert result.status == ToolResult.REJECTED
    assert "nests too deeply" in result.error_message
