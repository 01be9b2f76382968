"""Intent namespaces: ``intent_id_for(..., namespace)`` and ``AgentConfig.namespace``.

Without a namespace the ids are exactly those of earlier releases; with one they are derived
from it too. A suspended run keeps minting in the namespace it started with, even when the
config's namespace changes under it, so its pending and replayed intents keep their ids.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from apache_beam.pvalue import TaggedOutput

from beam_agents import AgentConfig
from beam_agents._protos import AgentEnvelope, Continuation, ToolIntent, ToolResult
from beam_agents.core.activation import escalate
from beam_agents.core.agent import (
    INTENT_NAMESPACE,
    Complete,
    Suspend,
    intent_id_for,
    namespace_uuid,
)
from beam_agents.core.context import ActivationContext
from beam_agents.core.observability import TraceRecorder, trace_id_for
from beam_agents.io.run_agent import INTENTS_TAG, AgentDoFn
from tests.core.harness import InMemoryKeyState

K = b"acct-1"


def test_without_a_namespace_the_ids_are_byte_for_byte_the_old_ones() -> None:
    # Golden ids, minted before namespaces existed (also in the intents_and_resume example).
    assert intent_id_for(b"order-1001", 0, 0) == "be14bf1a-1337-5caf-be3a-e3dcc940a9f2"
    assert intent_id_for(b"order-1001", 0, 1) == "f052fc51-ee95-5526-9e44-6b720e36bf37"
    assert intent_id_for(K, 0, 0) == "5a919a88-1019-5fc8-96a2-2f6a63faf98b"
    assert intent_id_for(K, 3, 7, None) == str(uuid.uuid5(INTENT_NAMESPACE, f"{K.hex()}|3|7"))


def test_a_namespace_derives_its_own_deterministic_ids() -> None:
    assert intent_id_for(K, 0, 0, "fraud") == "fdd78f6e-961b-58f2-9231-9cc236c4dd6e"
    space = uuid.uuid5(INTENT_NAMESPACE, "namespace:fraud")
    assert namespace_uuid("fraud") == space
    assert intent_id_for(K, 2, 5, "fraud") == str(uuid.uuid5(space, f"{K.hex()}|2|5"))
    assert intent_id_for(K, 2, 5, "fraud") == intent_id_for(K, 2, 5, "fraud")


def test_namespaces_never_share_an_id() -> None:
    positions = [
        (f"k{i}".encode(), seq, step) for i in range(20) for seq in range(5) for step in range(5)
    ]
    minted = {
        namespace: {intent_id_for(key, seq, step, namespace) for key, seq, step in positions}
        for namespace in (None, "fraud", "triage", "Fraud", "fraud ")
    }
    assert all(len(ids) == len(positions) for ids in minted.values())
    assert len(set.union(*minted.values())) == len(positions) * len(minted)


@pytest.mark.parametrize("bad", ["", b"fraud", 7])
def test_a_namespace_must_be_a_non_empty_str(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"AgentConfig\.namespace must be a non-empty str or None"):
        AgentConfig(namespace=bad)
    with pytest.raises(ValueError, match="namespace must be a non-empty str"):
        intent_id_for(K, 0, 0, bad)
    assert AgentConfig().namespace is None and AgentConfig(namespace="a").namespace == "a"


async def rewalk(ctx: ActivationContext) -> Complete | Suspend:
    """Re-walks its run on every resume: two parallel intents, then a receipt, then done."""
    first = ctx.act("notify", {"n": 1})
    second = ctx.act("notify", {"n": 2})
    if not {first, second} <= set(ctx.results):
        return Suspend()
    receipt = ctx.act("receipt", {})
    if receipt not in ctx.results:
        return Suspend()
    return Complete(output=json.dumps([first, second, receipt]).encode())


def running(namespace: str | None) -> AgentDoFn:
    dofn = AgentDoFn(rewalk, AgentConfig(namespace=namespace))
    dofn.setup()
    return dofn


def deliver(dofn: AgentDoFn, cells: InMemoryKeyState, envelope: AgentEnvelope) -> list[Any]:
    try:
        return cells.process(dofn, K, envelope)
    finally:
        dofn.teardown()


def event(at_ms: int) -> AgentEnvelope:
    return AgentEnvelope(entity_key=K, event_time_ms=at_ms, external_event=b"go")


def result(intent_id: str, seq: int, at_ms: int) -> AgentEnvelope:
    answer = ToolResult(intent_id=intent_id, entity_key=K, seq=seq, status=ToolResult.OK)
    return AgentEnvelope(entity_key=K, event_time_ms=at_ms, tool_result=answer)


def staged_ids(outputs: list[Any]) -> list[str]:
    return [
        o.value.intent_id for o in outputs if isinstance(o, TaggedOutput) and o.tag == INTENTS_TAG
    ]


def stored(cells: InMemoryKeyState) -> Continuation:
    assert cells.continuation.value is not None
    return Continuation.FromString(cells.continuation.value)


def test_a_suspended_run_keeps_its_namespace_when_the_config_changes() -> None:
    cells = InMemoryKeyState()
    old = [intent_id_for(K, 0, step, "v1") for step in range(3)]
    assert staged_ids(deliver(running("v1"), cells, event(1_000))) == old[:2]
    assert stored(cells).intent_namespace == "v1"
    assert list(stored(cells).pending_intent_ids) == old[:2]

    # Redeployed with another namespace while the run is suspended: the run re-walks its
    # intents with the ids they were staged with, and stages its next one in "v1" too.
    assert staged_ids(deliver(running("v2"), cells, result(old[0], 0, 2_000))) == []
    assert list(stored(cells).pending_intent_ids) == old[1:2]
    assert staged_ids(deliver(running("v2"), cells, result(old[1], 0, 3_000))) == old[2:]
    assert stored(cells).intent_namespace == "v1"
    done = deliver(running("v2"), cells, result(old[2], 0, 4_000))
    assert json.loads(next(o for o in done if isinstance(o, bytes))) == old
    assert cells.continuation.value is None

    # The next run starts in the config's namespace.
    new = [intent_id_for(K, 1, step, "v2") for step in range(2)]
    assert staged_ids(deliver(running("v2"), cells, event(5_000))) == new
    assert stored(cells).intent_namespace == "v2"


def test_a_run_without_a_namespace_records_none_and_mints_the_default_ids() -> None:
    cells = InMemoryKeyState()
    ids = staged_ids(deliver(running(None), cells, event(1_000)))
    assert ids == [intent_id_for(K, 0, 0), intent_id_for(K, 0, 1)]
    assert stored(cells).intent_namespace == ""


def test_a_deadline_escalation_asks_in_the_runs_namespace() -> None:
    suspended = Continuation(
        seq=2,
        next_step=3,
        trace_id=trace_id_for(K, 2),
        intent_namespace="v1",
        pending_intent_ids=[intent_id_for(K, 2, 0, "v1")],
        pending_kinds=[ToolIntent.APPROVAL],
    )
    trace = TraceRecorder(K, 2, suspended.trace_id, 5, 9_000)
    escalated, intent = escalate(
        suspended, trace, fired_ms=9_000, timeout_ms=1_000, intent_ttl_ms=1_000, channel="ops"
    )
    assert intent.intent_id == intent_id_for(K, 2, 3, "v1")
    assert list(escalated.pending_intent_ids) == [intent.intent_id]
    assert escalated.intent_namespace == "v1"
