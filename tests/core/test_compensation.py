"""Rule family: compensation. ``act(..., compensate_with=...)``, ``compensate`` and the route.

A link is checked when it is staged and kept in the run's continuation; ``compensate`` stages
the linked call as a step of the run (so a re-walk returns the same id and stages nothing),
refuses what it cannot compensate without taking a step, and a ``Deny(compensate=True)``
timeout route stages the undo of the run's effects, newest first.
"""

from __future__ import annotations

import logging

import pytest

from beam_agents import AgentConfig, Complete, Suspend
from beam_agents._protos import (
    CompensationLink,
    Continuation,
    ToolIntent,
    ToolResult,
    TraceEvent,
)
from beam_agents.core.activation import deadline_outcome, resumption, suspend, with_answer
from beam_agents.core.agent import CompensationError, ReadOnlyIntentError, intent_id_for
from beam_agents.core.context import ActivationContext, staged
from beam_agents.core.observability import trace_id_for
from beam_agents.hitl import Deny, FallbackContext, HitlPolicy
from beam_agents.testing import EnvelopeStream, epoch_clock
from beam_agents.tools.errors import ToolArgumentError, ToolNotFoundError
from tests.core.harness import run_agent, streamed
from tests.core.test_context import KEY, make_context, registry

SEQ = 4
REFUND = ("charge", {"amount": -5})


def charged(ctx: ActivationContext) -> str:
    return ctx.act("charge", {"amount": 5}, compensate_with=REFUND)


def test_act_links_a_checked_compensation_to_the_intent() -> None:
    ctx = make_context(seq=SEQ)
    intent_id = charged(ctx)
    [intent] = staged(ctx).intents
    assert intent.intent_id == intent_id == intent_id_for(KEY, SEQ, 0)
    assert (intent.compensate_tool, intent.compensate_args_json) == ("charge", '{"amount":-5}')
    assert intent.compensates_intent_id == ""
    [link] = staged(ctx).links
    assert (link.intent_id, link.step_index, link.compensation_intent_id) == (intent_id, 0, "")
    # The undo is not part of the effect's identity: the step's digest is that of the same
    # act without a link (and an intent without one keeps the bytes it always had).
    plain = make_context(seq=SEQ)
    plain.act("charge", {"amount": 5})
    assert staged(plain).intents[0].compensate_tool == ""
    assert staged(plain).cursor.new_steps == staged(ctx).cursor.new_steps


@pytest.mark.parametrize(
    ("compensate_with", "error"),
    [
        (("lookup", {"customer_id": "c"}), ReadOnlyIntentError),
        (("charge", {"amount": "lots"}), ToolArgumentError),
        (("chrage", {"amount": 1}), ToolNotFoundError),
        (("charge", "[1]"), ToolArgumentError),
        (["charge", {}], TypeError),
        (("", {}), ValueError),
    ],
)
def test_a_bad_compensation_is_refused_at_act_time_and_stages_nothing(
    compensate_with: object, error: type[Exception]
) -> None:
    ctx = make_context(seq=SEQ)
    with pytest.raises(error):
        ctx.act("charge", {"amount": 5}, compensate_with=compensate_with)  # type: ignore[arg-type]
    assert staged(ctx).intents == [] and ctx.next_step == 0 and staged(ctx).links == []


def test_compensate_stages_the_linked_call_as_a_step_that_never_expires() -> None:
    ctx = make_context(seq=SEQ)
    original = charged(ctx)
    undo = ctx.compensate(original)
    assert undo == intent_id_for(KEY, SEQ, 1)
    intent = staged(ctx).intents[1]
    assert (intent.kind, intent.tool_name, intent.args_json) == (
        ToolIntent.TOOL,
        "charge",
        '{"amount":-5}',
    )
    assert (intent.compensates_intent_id, intent.expires_at_ms) == (original, 0)
    assert staged(ctx).links[0].compensation_intent_id == undo


def test_compensate_refuses_what_it_cannot_compensate_without_taking_a_step() -> None:
    ctx = make_context(seq=SEQ)
    unlinked = ctx.act("charge", {"amount": 1})
    original = charged(ctx)
    ctx.compensate(original)
    before = ctx.next_step
    cases = {
        unlinked: "was staged without compensate_with",
        intent_id_for(KEY, SEQ + 1, 0): "was not staged by this run",
        original: "is already compensated by intent",
    }
    for intent_id, message in cases.items():
        with pytest.raises(CompensationError, match=message) as raised:
            ctx.compensate(intent_id)
        assert raised.value.intent_id == intent_id
    assert ctx.next_step == before and len(staged(ctx).intents) == 3


def resume(
    ctx: ActivationContext, answered: str, *, base: Continuation | None = None
) -> tuple[ActivationContext, Continuation]:
    """Suspend ``ctx``'s run, answer ``answered`` OK, and resume it; also the continuation."""
    suspended = suspend(
        base, staged(ctx), seq=SEQ, started_at_ms=1_000, snapshot=b"", adapter="", deadline_ms=0
    )
    answer = ToolResult(intent_id=answered, status=ToolResult.OK, payload=b"1")
    answered = with_answer(suspended, answer)
    next_ctx = make_context(
        seq=SEQ, first_step=answered.next_step, resumption=resumption(answered, answer)
    )
    return next_ctx, answered


def test_a_re_walk_returns_the_same_ids_and_stages_nothing_new() -> None:
    first = make_context(seq=SEQ)
    original = charged(first)
    probe = first.act("notify", {"trip": "x"})
    second, run = resume(first, original)
    assert [link.intent_id for link in run.compensations] == [original]
    # The resume re-walks the act, then compensates in a later activation of the run.
    assert charged(second) == original
    assert second.act("notify", {"trip": "x"}) == probe
    undo = second.compensate(original)
    assert undo == intent_id_for(KEY, SEQ, 2)
    assert [i.intent_id for i in staged(second).intents] == [undo]
    third, run = resume(second, probe, base=run)
    assert run.compensations[0].compensation_intent_id == undo
    # A second re-walk replays both the act and the compensation: same ids, nothing staged.
    assert charged(third) == original
    assert third.act("notify", {"trip": "x"}) == probe
    assert third.compensate(original) == undo
    assert staged(third).intents == []
    # Past the prefix, compensating again is refused (it was compensated at step 2).
    with pytest.raises(CompensationError, match="already compensated"):
        third.compensate(original)


def test_adding_or_changing_an_undo_in_the_code_never_re_runs_a_staged_effect(
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = make_context(seq=SEQ)
    plain = first.act("charge", {"amount": 5})  # staged by code that linked no undo
    second, _ = resume(first, plain)
    with caplog.at_level(logging.WARNING, logger="beam_agents.core.staging"):
        assert charged(second) == plain  # the same effect: replayed, not staged again
    assert staged(second).intents == []
    assert "keeps it as staged" in caplog.text
    with pytest.raises(CompensationError):  # no undo was linked when it was staged
        second.compensate(plain)
    linked = make_context(seq=SEQ)
    original = charged(linked)
    third, _ = resume(linked, original)
    changed = third.act("charge", {"amount": 5}, compensate_with=("charge", {"amount": -4}))
    assert changed == original and staged(third).intents == []
    undo = third.compensate(original)
    [staged_undo] = staged(third).intents
    assert staged_undo.intent_id == undo and staged_undo.args_json == '{"amount":-5}'  # recorded


def test_a_continuation_style_resume_compensates_an_effect_of_an_earlier_activation() -> None:
    first = make_context(seq=SEQ)
    original = charged(first)
    second, _ = resume(first, original)
    undo = second.compensate(original)  # the first step it takes: no re-walk
    assert undo == intent_id_for(KEY, SEQ, 1)
    assert staged(second).intents[0].compensates_intent_id == original


# -- the route ------------------------------------------------------------------------------


def linked_run() -> Continuation:
    """Run 4 at step 6 with four linked effects: OK, still pending, REJECTED, compensated."""

    def link(step: int, compensated: str = "") -> CompensationLink:
        return CompensationLink(
            intent_id=intent_id_for(KEY, SEQ, step),
            step_index=step,
            tool_name="charge",
            args_json=f'{{"amount":-{step}}}',
            compensation_intent_id=compensated,
        )

    done = [
        ToolResult(intent_id=intent_id_for(KEY, SEQ, 0), status=ToolResult.OK),
        ToolResult(intent_id=intent_id_for(KEY, SEQ, 2), status=ToolResult.REJECTED),
        ToolResult(intent_id=intent_id_for(KEY, SEQ, 3), status=ToolResult.OK),
    ]
    return Continuation(
        seq=SEQ,
        next_step=6,
        pending_intent_ids=[intent_id_for(KEY, SEQ, 1)],
        pending_kinds=[ToolIntent.TOOL],
        deadline_ms=10_000,
        results=done,
        trace_id=trace_id_for(KEY, SEQ),
        trace_sequence=9,
        compensations=[link(0), link(1), link(2), link(3, intent_id_for(KEY, SEQ, 4))],
    )


def test_deny_with_compensate_stages_the_undo_of_the_runs_effects_newest_first() -> None:
    run = linked_run()
    outcome = deadline_outcome(
        Deny(b"no", compensate=True), KEY, run, None, fired_ms=10_000, now_ms=50
    )
    undone = [intent.compensates_intent_id for intent in outcome.compensations]
    # Step 1 is still pending (it may yet run: the effector decides), step 0 ran OK; step 2
    # never ran and step 3 is compensated already.
    assert undone == [intent_id_for(KEY, SEQ, 1), intent_id_for(KEY, SEQ, 0)]
    assert [i.intent_id for i in outcome.compensations] == [
        intent_id_for(KEY, SEQ, 6),
        intent_id_for(KEY, SEQ, 7),
    ]
    assert [i.args_json for i in outcome.compensations] == ['{"amount":-1}', '{"amount":-0}']
    assert all(i.expires_at_ms == 0 and i.created_at_ms == 50 for i in outcome.compensations)
    assert outcome.outputs == [b"no"]
    assert [TraceEvent.EventType.Name(e.event_type) for e in outcome.traces] == [
        "ACTIVATION_START",
        "INTENT_EMITTED",
        "INTENT_EMITTED",
        "ACTIVATION_END",
    ]
    assert [e.step_index for e in outcome.traces] == [6, 6, 7, 8]
    # The default Deny compensates nothing.
    plain = deadline_outcome(Deny(b"no"), KEY, run, None, fired_ms=10_000, now_ms=50)
    assert plain.compensations == []
    with pytest.raises(TypeError):
        Deny(compensate=1)  # type: ignore[arg-type]


# -- in a pipeline --------------------------------------------------------------------------

K = b"booking-1"


def deny_and_undo(fallback: FallbackContext) -> Deny:
    return Deny(b"timed out", compensate=True)


async def book_then_ask(ctx: ActivationContext) -> Complete | Suspend:
    """Book a seat (undone by a cancellation), then ask a human to confirm the booking."""
    if not ctx.is_resume:
        ctx.act("charge", {"amount": 5}, compensate_with=("charge", {"amount": -5}))
        ctx.request_approval({"confirm": "booking"})
        return Suspend()
    if ctx.pending_intent_ids:
        return Suspend()
    return Complete(b"confirmed")


def test_a_run_denied_at_its_deadline_emits_the_compensation_of_its_effect() -> None:
    charge_id = intent_id_for(K, 0, 0)
    stream = (
        EnvelopeStream()
        .event(K, b"book", at_ms=1_000)
        .result(K, charge_id, payload=b'"charged 5 EUR"', at_ms=2_000)
        .advance_processing_time(6_000)
    )
    config = AgentConfig(
        tool_registry=registry(),
        hitl_policy=HitlPolicy(
            timeout_ms=5_000,
            intent_ttl_ms=30_000,
            approval_channel="ops",
            on_timeout=deny_and_undo,
        ),
        processing_clock=epoch_clock,
    )
    outputs = run_agent(streamed(stream), book_then_ask, config, streaming=True)
    assert outputs.output == [b"timed out"]
    undo = [i for i in outputs.intents if i.compensates_intent_id]
    assert [(i.intent_id, i.compensates_intent_id, i.args_json) for i in undo] == [
        (intent_id_for(K, 0, 2), charge_id, '{"amount":-5}')
    ]
    assert outputs.errors == []
