"""The continuation's one owner (``beam_agents.core.activation``), tested without Beam.

Admitting an answer, building the resumption and suspending each return a new continuation;
the pending lists and step records change only through these functions.
"""

from __future__ import annotations

from beam_agents._protos import Approval, Continuation, ToolIntent, ToolResult
from beam_agents.core.activation import resumption, suspend, with_answer
from beam_agents.core.observability import TraceRecorder, trace_id_for
from beam_agents.core.staging import Staged, StepCursor, StepRecord, intent_step_digest

KEY = b"k"


def waiting() -> Continuation:
    run = Continuation(
        seq=1,
        next_step=2,
        snapshot=b"snap",
        pending_intent_ids=["a", "b"],
        pending_kinds=[ToolIntent.TOOL, ToolIntent.APPROVAL],
        tokens_used=40,
        trace_id=trace_id_for(KEY, 1),
        trace_sequence=3,
    )
    run.steps.add(kind=StepRecord.INTENT, digest=b"0")
    run.steps.add(kind=StepRecord.APPROVAL, digest=b"1")
    return run


def test_admitting_a_result_moves_it_from_pending_to_answered() -> None:
    answer = ToolResult(intent_id="a", status=ToolResult.OK, payload=b"1")
    answered = with_answer(waiting(), answer)
    assert list(answered.pending_intent_ids) == ["b"]
    assert list(answered.pending_kinds) == [ToolIntent.APPROVAL]
    assert list(answered.answered_intent_ids) == ["a"] and list(answered.results) == [answer]
    assert waiting().pending_intent_ids == ["a", "b"]


def test_admitting_an_approval_records_the_decision() -> None:
    decision = Approval(intent_id="b", approved=True, approver="ana")
    answered = with_answer(waiting(), decision)
    assert list(answered.approvals) == [decision] and list(answered.results) == []


def test_the_resumption_carries_what_the_run_received_and_still_waits_for() -> None:
    answer = ToolResult(intent_id="a", status=ToolResult.OK)
    resumed = resumption(with_answer(waiting(), answer), answer)
    assert resumed.result == answer and resumed.approval is None
    assert resumed.snapshot == b"snap" and dict(resumed.results) == {"a": answer}
    assert resumed.pending == (("b", ToolIntent.APPROVAL),) and resumed.tokens_used == 40
    assert [step.digest for step in resumed.steps] == [b"0", b"1"]


def staged_resume(base: Continuation) -> Staged:
    """A resumed activation of ``base``'s run that staged one more intent at step 2."""
    trace = TraceRecorder(KEY, 1, base.trace_id, base.trace_sequence, 9)
    cursor = StepCursor(base.next_step, base.steps)
    record = Staged(trace, cursor, (("b", 3),), 40)
    record.stage_intent(ToolIntent.TOOL, "ship", "{}", 100, "")
    assert [intent.step_index for intent in record.intents] == [2]
    record.tokens_used = 2
    return record


def test_suspending_again_carries_the_pending_set_and_appends_the_new_steps() -> None:
    base = with_answer(waiting(), ToolResult(intent_id="a", status=ToolResult.OK))
    record = staged_resume(base)
    suspended = suspend(
        base, record, seq=1, started_at_ms=0, snapshot=b"next", adapter="", deadline_ms=77
    )
    new_intent = record.intents[0].intent_id
    assert list(suspended.pending_intent_ids) == ["b", new_intent]
    shipped = intent_step_digest(ToolIntent.TOOL, "ship", "{}")
    assert [step.digest for step in suspended.steps] == [b"0", b"1", shipped]
    assert suspended.next_step == 3 and suspended.snapshot == b"next"
    assert suspended.tokens_used == 42 and suspended.deadline_ms == 77
    # INTENT_EMITTED and SUSPENDED were traced after the run's first three events.
    assert suspended.trace_sequence == 3 + 2
