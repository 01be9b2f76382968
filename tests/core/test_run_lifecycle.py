"""Rule family: one lifecycle. A run's identity, and what it stops waiting for when it moves on.

Every id that names a run includes its namespace (traces, spans, ``.errors`` records). A run
that leaves a suspension by any route withdraws, one ``WITHDRAWAL`` intent each, the intents it
still waited for. Approvals never outlive the run's wait, and no suspension on intents is left
without a deadline. Pure decisions are tested first, then one key through ``AgentDoFn``, then
pipelines on the default runners.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from apache_beam.pvalue import TaggedOutput
from apache_beam.utils.timestamp import Timestamp

from beam_agents import AgentConfig, Complete, Suspend
from beam_agents._protos import (
    AgentEnvelope,
    AgentError,
    CompensationLink,
    Continuation,
    ToolIntent,
    ToolResult,
    TraceEvent,
    canonical_json,
    submission_digest,
    withdrawal_id_for,
)
from beam_agents.core.activation import RouteFailure, awaited, deadline_outcome
from beam_agents.core.agent import MAX_DURATION_MS, intent_id_for
from beam_agents.core.context import ActivationContext
from beam_agents.core.observability import trace_id_for
from beam_agents.hitl import Deny, Drop, FallbackContext, HitlPolicy
from beam_agents.io.run_agent import AgentDoFn, agent_dofn
from beam_agents.testing import EnvelopeStream, FailFirstCommit, epoch_clock
from tests.core.harness import InMemoryKeyState, Outputs, created, event, run_agent, streamed

K = b"acct-\xe2\x80\xae1"  # U+202E inside the key: ids are built from its bytes


# -- one identity per run -----------------------------------------------------------------------
async def fails_on_boom(ctx: ActivationContext) -> Complete:
    if ctx.event == b"boom":
        raise RuntimeError("boom")
    return Complete(output=b"ok")


def issue_scenario(namespace: str | None) -> Outputs:
    """A failing event, then one that completes, on one key, in a fresh pipeline."""
    events = [event(K, b"boom", at_ms=1_000), event(K, b"ok", at_ms=2_000)]
    return run_agent(created(events), fails_on_boom, AgentConfig(namespace=namespace))


def test_runs_of_different_namespaces_on_one_key_share_no_trace_span_or_error_id() -> None:
    plain, v2 = issue_scenario(None), issue_scenario("v2")
    for outputs in (plain, v2):
        assert [error.reason for error in outputs.errors] == ["activation_error"]
        assert outputs.output == [b"ok"]
    plain_traces = {event.trace_id for event in plain.traces}
    v2_traces = {event.trace_id for event in v2.traces}
    assert plain_traces == {trace_id_for(K, 0)} and v2_traces == {trace_id_for(K, 0, "v2")}
    assert plain_traces.isdisjoint(v2_traces)
    # Span ids too: a store keyed on either id alone would still tell the runs apart.
    plain_spans = {event.span_id for event in plain.traces}
    v2_spans = {event.span_id for event in v2.traces}
    assert plain_spans.isdisjoint(v2_spans)
    assert all(len(span) == 16 and int(span, 16) >= 0 for span in v2_spans)
    v2_parents = {event.parent_span_id for event in v2.traces if event.parent_span_id}
    assert v2_parents <= v2_spans  # parents point inside the run's own spans
    # Each error names the run it belongs to, as its ERROR trace event does.
    for outputs in (plain, v2):
        [error] = outputs.errors
        [failure] = [e for e in outputs.traces if e.event_type == TraceEvent.ERROR]
        assert error.trace_id == failure.trace_id != ""
    assert plain.errors[0].trace_id != v2.errors[0].trace_id
    # The run's first span names its namespace, so a reader can label the run.
    for outputs, expected in ((plain, None), (v2, "v2")):
        firsts = (TraceEvent.ACTIVATION_START, TraceEvent.ERROR)
        starts = [e for e in outputs.traces if e.event_type in firsts]
        assert starts and all(
            e.attributes.get("beam_agents.namespace") == expected for e in starts
        ), starts


def test_runs_without_a_namespace_keep_todays_ids() -> None:
    assert trace_id_for(K, 3) == trace_id_for(K, 3, None) != trace_id_for(K, 3, "")
    assert trace_id_for(K, 3, "v2") != trace_id_for(K, 3)
    assert trace_id_for(K, 3, "v2") != trace_id_for(K, 3, "v3")
    outputs = issue_scenario(None)
    spans = sorted(event.span_id for event in outputs.traces if event.seq == 0)
    assert "000000000000" + f"{TraceEvent.ACTIVATION_START:04x}" in spans


# -- withdrawals: pure decisions -----------------------------------------------------------------
def waiting_run(namespace: str = "") -> Continuation:
    """Run 2, at step 3, waiting for a tool intent (step 0) and an approval (step 2)."""
    ns = namespace or None
    return Continuation(
        seq=2,
        next_step=3,
        snapshot=b"s",
        pending_intent_ids=[intent_id_for(K, 2, 0, ns), intent_id_for(K, 2, 2, ns)],
        pending_kinds=[ToolIntent.TOOL, ToolIntent.APPROVAL],
        deadline_ms=10_000,
        trace_id=trace_id_for(K, 2, ns),
        trace_sequence=7,
        intent_namespace=namespace,
    )


def deny(fallback: FallbackContext) -> Deny:
    return Deny(b"denied")


def drop(fallback: FallbackContext) -> Drop:
    return Drop()


def policy(route: Any) -> HitlPolicy:
    return HitlPolicy(
        timeout_ms=5_000, intent_ttl_ms=300_000, approval_channel="ops", on_timeout=route
    )


def reason_of(intent: ToolIntent) -> str:
    reason: str = json.loads(intent.args_json)["reason"]
    return reason


@pytest.mark.parametrize(
    ("route", "words"),
    [
        (Deny(b"denied"), "denied"),
        (Drop(), "dropped"),
        (RouteFailure(RuntimeError("route bug")), "failed"),
    ],
)
def test_every_ending_deadline_route_withdraws_each_intent_the_run_awaited(
    route: Any, words: str
) -> None:
    run = waiting_run("v2")
    outcome = deadline_outcome(route, K, run, None, fired_ms=10_000, now_ms=4_321)
    targets = list(run.pending_intent_ids)
    assert [w.withdraws_intent_id for w in outcome.withdrawals] == targets
    for withdrawal, step in zip(outcome.withdrawals, (0, 2), strict=True):
        assert withdrawal == ToolIntent(
            intent_id=withdrawal_id_for(withdrawal.withdraws_intent_id),
            withdraws_intent_id=withdrawal.withdraws_intent_id,
            entity_key=K,
            seq=2,
            step_index=step,
            trace_id=run.trace_id,
            tool_name="",
            args_json=withdrawal.args_json,
            created_at_ms=4_321,
            expires_at_ms=0,
            kind=ToolIntent.WITHDRAWAL,
        )
        assert withdrawal.args_json == canonical_json({"reason": reason_of(withdrawal)})
        assert words in reason_of(withdrawal)
    errors = outcome.errors
    assert all(error.trace_id == run.trace_id for error in errors)
    again = deadline_outcome(route, K, run, None, fired_ms=10_000, now_ms=4_321)
    assert [w.SerializeToString(deterministic=True) for w in again.withdrawals] == [
        w.SerializeToString(deterministic=True) for w in outcome.withdrawals
    ]


def test_compensations_are_not_awaited_so_never_withdrawn() -> None:
    run = waiting_run()
    compensation = intent_id_for(K, 2, 3)
    run.pending_intent_ids.append(compensation)
    run.pending_kinds.append(ToolIntent.TOOL)
    run.compensations.append(
        CompensationLink(
            intent_id=intent_id_for(K, 2, 0), step_index=0, compensation_intent_id=compensation
        )
    )
    assert awaited(run) == [intent_id_for(K, 2, 0), intent_id_for(K, 2, 2)]
    outcome = deadline_outcome(Drop(), K, run, None, fired_ms=10_000, now_ms=1)
    assert compensation not in {w.withdraws_intent_id for w in outcome.withdrawals}


# -- one key through AgentDoFn: completion, approvals' expiry, implicit deadlines ------------
class Clock:
    """A processing clock the test moves (seconds since the epoch)."""

    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def of_type(outputs: list[Any], kind: type) -> list[Any]:
    return [
        out.value
        for out in outputs
        if isinstance(out, TaggedOutput) and isinstance(out.value, kind)
    ]


def result(intent_id: str, at_ms: int, status: int = ToolResult.OK) -> AgentEnvelope:
    answer = ToolResult(intent_id=intent_id, entity_key=K, status=status, payload=b'"r"')  # type: ignore[arg-type]
    return AgentEnvelope(entity_key=K, event_time_ms=at_ms, tool_result=answer)


async def first_answer_wins(ctx: ActivationContext) -> Complete | Suspend:
    """Asks three regions and an approver; completes on the first answer."""
    if ctx.is_resume:
        return Complete(output=b"first")
    for region in ("eu", "us", "ap"):
        ctx.act("lookup", {"region": region}, ttl_ms=10_000 * (1 + len(region)))
    ctx.request_approval({"why": "backup"}, ttl_ms=90_000)
    return Suspend()


@pytest.fixture
def clock() -> Clock:
    return Clock(1_000.0)


def started(agent: Any, config: AgentConfig) -> Iterator[AgentDoFn]:
    dofn = agent_dofn(agent, config)
    dofn.setup()
    yield dofn
    dofn.teardown()


def test_completing_withdraws_the_intents_still_pending(clock: Clock) -> None:
    for dofn in started(first_answer_wins, AgentConfig(processing_clock=clock)):
        cells = InMemoryKeyState()
        first = of_type(cells.process(dofn, K, event(K, b"go", 1_000)[1]), ToolIntent)
        assert [i.kind for i in first] == [ToolIntent.TOOL] * 3 + [ToolIntent.APPROVAL]
        outputs = cells.process(dofn, K, result(first[1].intent_id, 7_000))
    withdrawn = of_type(outputs, ToolIntent)
    assert [w.withdraws_intent_id for w in withdrawn] == [
        first[0].intent_id,
        first[2].intent_id,
        first[3].intent_id,
    ]
    assert [w.step_index for w in withdrawn] == [0, 2, 3]
    assert {w.kind for w in withdrawn} == {ToolIntent.WITHDRAWAL}
    assert {w.created_at_ms for w in withdrawn} == {7_000}  # the activation's event time
    assert {w.trace_id for w in withdrawn} == {trace_id_for(K, 0)}
    assert {reason_of(w) for w in withdrawn} == {"the run completed without waiting for it"}


def test_a_suspension_without_timeout_waits_for_its_longest_ttl_plus_the_grace(
    clock: Clock,
) -> None:
    config = AgentConfig(processing_clock=clock, result_grace_ms=7_000)
    for dofn in started(first_answer_wins, config):
        cells = InMemoryKeyState()
        cells.process(dofn, K, event(K, b"go", 1_000)[1])
        suspended = Continuation.FromString(cells.continuation.value or b"")
        # The approval's 90 s is the longest window: deadline = now + 90 s + 7 s.
        assert suspended.deadline_ms == 1_000_000 + 90_000 + 7_000
        assert cells.deadline.at == Timestamp(micros=suspended.deadline_ms * 1000)
        clock.now_s = 1_200.0  # past the deadline: no policy, so the run is dropped
        fired = Timestamp(micros=suspended.deadline_ms * 1000)
        outputs = dofn._on_deadline(key=K, fired=fired, **cells.params())
    [error] = of_type(outputs, AgentError)
    assert error.reason == "suspension_dropped" and error.trace_id == trace_id_for(K, 0)
    withdrawn = of_type(outputs, ToolIntent)
    assert len(withdrawn) == 4 and {w.kind for w in withdrawn} == {ToolIntent.WITHDRAWAL}


async def resumes_then_waits_again(ctx: ActivationContext) -> Complete | Suspend:
    """Stages a long and a short intent; on the short one's result, waits for a third."""
    if not ctx.is_resume:
        ctx.act("slow", {}, ttl_ms=600_000)
        ctx.act("fast", {}, ttl_ms=1_000)
        return Suspend()
    ctx.act("quick", {}, ttl_ms=2_000)
    return Suspend()


def test_a_re_suspension_keeps_the_deadline_its_carried_intents_need(clock: Clock) -> None:
    config = AgentConfig(processing_clock=clock)
    for dofn in started(resumes_then_waits_again, config):
        cells = InMemoryKeyState()
        cells.process(dofn, K, event(K, b"go", 1_000)[1])
        first = Continuation.FromString(cells.continuation.value or b"")
        assert first.deadline_ms == 1_000_000 + 600_000 + 300_000
        clock.now_s = 1_010.0
        cells.process(dofn, K, result(intent_id_for(K, 0, 1), 2_000))
        again = Continuation.FromString(cells.continuation.value or b"")
    assert again.deadline_ms == first.deadline_ms  # the slow intent may still answer


def test_result_grace_ms_must_be_a_positive_int() -> None:
    for bad in (0, -1, 1.5, True, None, "300000"):
        with pytest.raises(ValueError, match="result_grace_ms"):
            AgentConfig(result_grace_ms=bad)  # type: ignore[arg-type]
    assert AgentConfig().result_grace_ms == 300_000


def test_durations_past_any_representable_deadline_are_refused_where_they_are_given() -> None:
    """A deadline is now plus a duration: it must fit an int64, or the pipeline would crash."""
    huge = 2**63 - 1
    for name in ("ttl_ms", "intent_ttl_ms", "result_grace_ms"):
        with pytest.raises(ValueError, match=f"{name} must be a positive int"):
            AgentConfig(**{name: huge})
        AgentConfig(**{name: MAX_DURATION_MS})  # about 8,000 years is still a duration
    with pytest.raises(ValueError, match=r"HitlPolicy\.timeout_ms"):
        HitlPolicy(timeout_ms=2**62, intent_ttl_ms=1, approval_channel="ops", on_timeout=deny)
    with pytest.raises(ValueError, match=r"Suspend\.timeout_ms"):
        Suspend(timeout_ms=huge)


async def waits_forever(ctx: ActivationContext) -> Complete | Suspend:
    ctx.act("note", {"n": 1})
    return Suspend(timeout_ms=2**63 - 1)


def test_an_agent_suspending_past_any_deadline_fails_its_activation_not_the_pipeline() -> None:
    outputs = run_agent(created([event(K, b"go"), event(b"other", b"go")]), waits_forever)
    assert {error.reason for error in outputs.errors} == {"activation_error"}
    assert all("Suspend.timeout_ms" in error.detail for error in outputs.errors)
    assert outputs.intents == [] and len(outputs.errors) == 2


async def asks_with_its_own_timeout(ctx: ActivationContext) -> Complete | Suspend:
    if ctx.is_resume:
        return Complete(output=b"decided")
    ctx.request_approval({"amount": 10**18, "to": "acct-\u202e4321"})
    ctx.act("note", {"n": 1})  # a tool intent keeps its own TTL
    return Suspend(timeout_ms=20_000)


def test_an_approval_never_outlives_the_suspension_timeout(clock: Clock) -> None:
    """The issue's case: Suspend(timeout_ms=20000) with approvals of a 300 s TTL."""
    config = AgentConfig(processing_clock=clock, hitl_policy=policy(deny))
    for dofn in started(asks_with_its_own_timeout, config):
        intents = []
        for _ in range(2):  # a retried bundle mints the same bytes
            cells = InMemoryKeyState()
            intents.append(of_type(cells.process(dofn, K, event(K, b"go", 5_000)[1]), ToolIntent))
    approval, note = intents[0]
    assert (approval.created_at_ms, approval.expires_at_ms) == (5_000, 25_000)
    assert note.expires_at_ms == 5_000 + config.intent_ttl_ms
    assert [i.SerializeToString(deterministic=True) for i in intents[0]] == [
        i.SerializeToString(deterministic=True) for i in intents[1]
    ]


async def reads_the_refusal(ctx: ActivationContext) -> Complete | Suspend:
    if not ctx.is_resume:
        ctx.act("transfer", {"amount": 5})
        return Suspend(timeout_ms=60_000)
    answer = ctx.resume_result
    assert answer is not None
    return Complete(output=ToolResult.Status.Name(answer.status).encode())


def test_a_rejected_result_resumes_the_run_like_any_result(clock: Clock) -> None:
    for dofn in started(reads_the_refusal, AgentConfig(processing_clock=clock)):
        cells = InMemoryKeyState()
        cells.process(dofn, K, event(K, b"go", 1_000)[1])
        answer = result(intent_id_for(K, 0, 0), 2_000, ToolResult.REJECTED)
        outputs = cells.process(dofn, K, answer)
    assert [out for out in outputs if isinstance(out, bytes)] == [b"REJECTED"]
    assert of_type(outputs, AgentError) == [] and cells.continuation.value is None


def test_a_conflicts_rejection_resumes_only_the_run_whose_submission_was_refused(
    clock: Clock,
) -> None:
    """Two pipelines mint one id with different arguments: the effector keeps one submission."""
    for dofn in started(reads_the_refusal, AgentConfig(processing_clock=clock)):
        cells = InMemoryKeyState()
        [staged] = of_type(cells.process(dofn, K, event(K, b"go", 1_000)[1]), ToolIntent)
        waiting = cells.continuation.value
        other = ToolIntent()
        other.CopyFrom(staged)
        other.args_json = '{"amount":6}'  # the other pipeline's submission of the same id
        for refused, admitted in ((other, False), (staged, True)):
            cells.continuation.value = waiting
            conflict = result(staged.intent_id, 2_000, ToolResult.REJECTED)
            conflict.tool_result.refused_submission_digest = submission_digest(refused)
            outputs = cells.process(dofn, K, conflict)
            if admitted:  # this run's own submission was refused: it resumes
                assert [out for out in outputs if isinstance(out, bytes)] == [b"REJECTED"]
                assert cells.continuation.value is None
            else:  # this run's submission was kept and will run: it keeps waiting
                [error] = of_type(outputs, AgentError)
                assert error.reason == "orphaned_result"
                assert "refused as a conflict" in error.detail
                assert error.trace_id == trace_id_for(K, 0)  # about this run's own intent
                assert cells.continuation.value == waiting


# -- pipelines: a deny route on the streaming runner, retried bundles ----------------------------
async def asks_and_acts(ctx: ActivationContext) -> Complete | Suspend:
    if ctx.is_resume:
        return Complete(output=b"resumed")
    ctx.act("hold", {"card": "7"})
    ctx.request_approval({"card": "7"})
    return Suspend(snapshot=b"card-7")


def test_a_retried_deadline_bundle_withdraws_with_byte_identical_intents(tmp_path: Any) -> None:
    stream = EnvelopeStream().event(K, b"go", at_ms=1_000).advance_processing_time(6_000)
    outputs = []
    for attempt, before_commit in enumerate((None, FailFirstCommit(tmp_path, trigger="deadline"))):
        config = AgentConfig(
            hitl_policy=policy(deny), processing_clock=epoch_clock, before_commit=before_commit
        )
        ran = run_agent(streamed(stream), asks_and_acts, config, streaming=True)
        assert ran.output == [b"denied"], attempt
        outputs.append(
            sorted(
                i.SerializeToString(deterministic=True)
                for i in ran.intents
                if i.kind == ToolIntent.WITHDRAWAL
            )
        )
    assert len(outputs[0]) == 2 and outputs[0] == outputs[1]
    withdrawn = [ToolIntent.FromString(raw) for raw in outputs[0]]
    assert sorted(w.withdraws_intent_id for w in withdrawn) == sorted(
        intent_id_for(K, 0, step) for step in (0, 1)
    )


async def acts_then_completes(ctx: ActivationContext) -> Complete | Suspend:
    if ctx.is_resume:
        return Complete(output=b"done")
    ctx.act("ship", {})
    return Suspend(timeout_ms=60_000)


def test_a_resumed_run_keeps_the_trace_and_span_ids_of_the_namespace_it_started_in(
    clock: Clock,
) -> None:
    """Started under v1, resumed by a pipeline redeployed with v2: still v1's ids."""
    traces: list[TraceEvent] = []
    cells = InMemoryKeyState()
    for namespace, envelope in (
        ("v1", event(K, b"go", 1_000)[1]),
        ("v2", result(intent_id_for(K, 0, 0, "v1"), 2_000)),
    ):
        config = AgentConfig(namespace=namespace, processing_clock=clock)
        for dofn in started(acts_then_completes, config):
            traces += of_type(cells.process(dofn, K, envelope), TraceEvent)
    assert {event.trace_id for event in traces} == {trace_id_for(K, 0, "v1")}
    resumed = [event for event in traces if event.sequence >= 3]
    assert resumed and all(event.parent_span_id == resumed[0].span_id for event in resumed[1:])
    v1_only = InMemoryKeyState()
    for dofn in started(acts_then_completes, AgentConfig(namespace="v1", processing_clock=clock)):
        v1_only.process(dofn, K, event(K, b"go", 1_000)[1])
        expected = of_type(
            v1_only.process(dofn, K, result(intent_id_for(K, 0, 0, "v1"), 2_000)), TraceEvent
        )
    assert [e.span_id for e in resumed] == [e.span_id for e in expected]


def test_every_error_of_a_run_names_its_trace_and_errors_of_no_run_name_none(
    clock: Clock,
) -> None:
    config = AgentConfig(namespace="v2", processing_clock=clock, max_buffered_events=1)
    for dofn in started(acts_then_completes, config):
        cells = InMemoryKeyState()
        stray = result("not-an-intent-of-this-run", 1_500)
        [no_run] = of_type(cells.process(dofn, K, stray), AgentError)
        cells.process(dofn, K, event(K, b"go", 2_000)[1])
        [not_pending] = of_type(cells.process(dofn, K, stray), AgentError)
        cells.process(dofn, K, event(K, b"queued", 3_000)[1])
        [overflow] = of_type(cells.process(dofn, K, event(K, b"more", 4_000)[1]), AgentError)
        params = {name: cell for name, cell in cells.params().items() if name != "idle"}
        [malformed] = of_type(dofn.process((K, "not an envelope"), **params), AgentError)
    assert (no_run.reason, no_run.trace_id) == ("orphaned_result", "")
    assert (malformed.reason, malformed.trace_id) == ("malformed_element", "")
    run_trace = trace_id_for(K, 0, "v2")
    # An answer to an intent the suspended run never staged belongs to no run it knows.
    assert (not_pending.reason, not_pending.trace_id) == ("orphaned_result", "")
    assert (overflow.reason, overflow.trace_id) == ("buffer_overflow", run_trace)
