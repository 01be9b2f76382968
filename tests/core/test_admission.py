"""Rule family: admission. Which elements reach an agent, which answers may resume a run.

The rules are plain functions of the key's state (``beam_agents.core.activation``), tested first
without Beam; the pipeline tests below show the same refusals reaching ``.errors`` and changing
nothing, and ``RunAgent`` refusing input that is not keyed envelopes when the graph is built.
"""

from __future__ import annotations

import json

import apache_beam as beam
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from beam_agents import RunAgent, intent_id_for
from beam_agents._protos import (
    AgentEnvelope,
    Approval,
    Continuation,
    ToolIntent,
    ToolResult,
    TraceEvent,
)
from beam_agents.core.activation import DEADLINE_APPROVER, answer_refusal, element_problem
from beam_agents.testing import EnvelopeStream
from tests.core.harness import Outputs, created, event, fan_out, run_agent, streamed, tally

KEY = b"acct-1"


def suspended_run(*, deadline_ms: int = 0) -> Continuation:
    """A run waiting for a tool intent ``t-1`` and an approval ``a-1``; ``t-0`` was answered."""
    return Continuation(
        seq=3,
        pending_intent_ids=["t-1", "a-1"],
        pending_kinds=[ToolIntent.TOOL, ToolIntent.APPROVAL],
        answered_intent_ids=["t-0"],
        deadline_ms=deadline_ms,
    )


def never() -> int:
    """A processing clock for runs without a deadline: admission must not read it."""
    raise AssertionError("the processing clock was read")


def result(intent_id: str, **fields: object) -> ToolResult:
    fields.setdefault("status", ToolResult.OK)
    return ToolResult(intent_id=intent_id, **fields)  # type: ignore[arg-type]


def test_an_answer_to_a_pending_intent_is_admitted() -> None:
    assert answer_refusal(KEY, suspended_run(), result("t-1"), never) is None
    assert answer_refusal(KEY, suspended_run(), Approval(intent_id="a-1"), never) is None


def test_an_approval_intent_may_be_ended_by_a_tool_result() -> None:
    expired = result("a-1", status=ToolResult.EXPIRED)
    assert answer_refusal(KEY, suspended_run(), expired, never) is None


def test_an_answer_with_no_suspended_run_is_refused() -> None:
    refusal = answer_refusal(KEY, None, result("t-1"), never)
    assert refusal is not None and "no suspended run" in refusal


def test_a_result_naming_another_key_is_refused() -> None:
    refusal = answer_refusal(KEY, suspended_run(), result("t-1", entity_key=b"other"), never)
    assert refusal is not None and "names another key" in refusal


def test_a_second_delivery_is_a_duplicate() -> None:
    refusal = answer_refusal(KEY, suspended_run(), result("t-0"), never)
    assert refusal is not None and refusal.startswith("duplicate delivery")


def test_a_decision_on_an_approval_the_deadline_already_answered_arrived_too_late() -> None:
    run = suspended_run()
    run.answered_intent_ids.append("a-0")
    run.approvals.append(Approval(intent_id="a-0", approver=DEADLINE_APPROVER))
    refusal = answer_refusal(KEY, run, Approval(intent_id="a-0", approved=True), never)
    assert refusal is not None and "timed out and was escalated" in refusal


def test_an_answer_to_an_intent_that_is_not_pending_is_refused() -> None:
    refusal = answer_refusal(KEY, suspended_run(), result("t-9"), never)
    assert refusal is not None and "is not pending" in refusal and "(seq 3)" in refusal


def test_a_tool_intent_never_takes_an_approval() -> None:
    refusal = answer_refusal(KEY, suspended_run(), Approval(intent_id="t-1"), never)
    assert refusal is not None and "cannot take an approval" in refusal


@pytest.mark.parametrize(("now_ms", "admitted"), [(9_999, True), (10_000, False), (10_001, False)])
def test_an_answer_at_or_after_the_deadline_is_left_to_the_timeout_route(
    now_ms: int, admitted: bool
) -> None:
    refusal = answer_refusal(KEY, suspended_run(deadline_ms=10_000), result("t-1"), lambda: now_ms)
    assert (refusal is None) == admitted
    if not admitted:
        assert refusal is not None and "the timeout route decides" in refusal


def test_the_clock_is_read_only_once_every_other_rule_has_passed() -> None:
    run = suspended_run(deadline_ms=10_000)
    duplicate = answer_refusal(KEY, run, result("t-0"), never)
    assert duplicate is not None and duplicate.startswith("duplicate delivery")


def envelope(key: bytes, **payload: object) -> AgentEnvelope:
    return AgentEnvelope(entity_key=key, event_time_ms=5, **payload)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("element", "reason"),
    [
        ("not a pair", "malformed_element"),
        ((KEY, b"not an envelope"), "malformed_element"),
        (("text key", envelope(KEY, external_event=b"x")), "malformed_element"),
        ((b"", envelope(b"", external_event=b"x")), "empty_key"),
        ((KEY, envelope(b"other", external_event=b"x")), "key_mismatch"),
        ((KEY, envelope(KEY)), "missing_payload"),
    ],
)
def test_malformed_elements_get_a_typed_reason(element: object, reason: str) -> None:
    problem = element_problem(element)
    assert problem is not None and problem.reason == reason and problem.detail


def test_a_refused_envelope_is_kept_whole_so_it_can_be_re_driven() -> None:
    bad = envelope(b"other", external_event=b"payload")
    problem = element_problem((KEY, bad))
    assert problem is not None and AgentEnvelope.FromString(problem.envelope) == bad


def test_a_well_formed_element_is_admitted() -> None:
    assert element_problem((KEY, envelope(KEY, external_event=b"x"))) is None


# -- in a pipeline --------------------------------------------------------------------------

K = b"acct-7"
"""The key of the pipeline tests below."""


def test_malformed_elements_become_typed_errors_and_good_ones_still_run() -> None:
    good = event(b"good", b"e")
    elements = [
        good,
        "not a pair",
        (b"k", b"not an envelope"),
        (b"", AgentEnvelope(entity_key=b"", external_event=b"e")),
        (b"k", AgentEnvelope(entity_key=b"other", external_event=b"e")),
        (b"k", AgentEnvelope(entity_key=b"k", event_time_ms=5)),
        ("text-key", AgentEnvelope(entity_key=b"k", external_event=b"e")),
    ]
    outputs = run_agent(created(elements, typed=False), tally)
    assert outputs.output == [b"good:0"]
    assert outputs.reasons() == sorted(
        [
            "malformed_element",
            "malformed_element",
            "empty_key",
            "key_mismatch",
            "missing_payload",
            "malformed_element",
        ]
    )
    missing = next(e for e in outputs.errors if e.reason == "missing_payload")
    assert AgentEnvelope.FromString(missing.envelope).event_time_ms == 5


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([b"a", b"b"], "expects a PCollection of \\(bytes, AgentEnvelope\\) pairs"),
        ([("k", AgentEnvelope())], "keys must be bytes"),
        ([(b"k", b"v")], "values must be AgentEnvelope"),
    ],
)
def test_input_that_is_not_keyed_envelopes_is_refused_at_construction(
    values: list[object], message: str
) -> None:
    with pytest.raises(ValueError, match=message), beam.Pipeline(runner=FnApiRunner()) as pipeline:
        pipeline | beam.Create(values) | RunAgent(tally)


def refusals(outputs: Outputs) -> list[tuple[str, str, str]]:
    """``(payload kind, intent id, detail)`` of every orphaned result, in arrival order."""
    found = []
    for error in sorted(outputs.errors, key=lambda error: error.event_time_ms):
        assert error.reason == "orphaned_result"
        envelope = AgentEnvelope.FromString(error.envelope)
        kind = envelope.WhichOneof("payload")
        answer = envelope.approval if kind == "approval" else envelope.tool_result
        found.append((kind, answer.intent_id, error.detail))
    return found


def test_orphaned_and_duplicate_results_are_refused_and_change_nothing() -> None:
    first, second, third = (intent_id_for(K, 0, step) for step in range(3))
    stream = (
        EnvelopeStream()
        .result(b"never-suspended", "some-intent", at_ms=500)
        .event(K, b"go", at_ms=1_000)
        .result(K, "not-an-intent-of-this-run", at_ms=1_100)
        .approval(K, second, approved=True, at_ms=1_150)
        .result(K, second, payload=b'"r1"', at_ms=1_200)
        .result(K, second, payload=b'"duplicate"', at_ms=1_300)
        .result(K, first, payload=b'"r0"', at_ms=1_400)
        .result(K, third, payload=b'"r2"', at_ms=1_500)
        .result(K, third, payload=b'"late"', at_ms=1_600)
    )
    outputs = run_agent(streamed(stream), fan_out, streaming=True)
    # The run completed exactly as if the refused envelopes had never arrived.
    [answers] = [json.loads(raw) for raw in outputs.output]
    assert answers == {first: '"r0"', second: '"r1"', third: '"r2"'}
    found = refusals(outputs)
    expected = [
        ("tool_result", "some-intent", "no suspended run on this key"),
        ("tool_result", "not-an-intent-of-this-run", "is not pending in this key's suspended run"),
        ("approval", second, "is a tool intent and cannot take an approval"),
        ("tool_result", second, "duplicate delivery"),
        ("tool_result", third, "no suspended run on this key"),
    ]
    assert len(found) == len(expected)
    for (kind, intent_id, detail), (want_kind, want_id, want_text) in zip(
        found, expected, strict=True
    ):
        assert (kind, intent_id) == (want_kind, want_id)
        assert want_text in detail
    # Only the admitted results resumed the run: one start per admitted result, no more.
    starts = [e for e in outputs.traces_for(K) if e.event_type == TraceEvent.ACTIVATION_START]
    assert len(starts) == 4
