"""The activation machine: what one envelope or timer firing does to one key, without Beam.

:meth:`Activator.activate` dispatches each input to one ``_apply_<kind>``, which fills a
:class:`Plan` (state writes, timers, outputs) for the Beam glue to apply.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from beam_agents._protos import (
    ActivationRecord,
    AgentEnvelope,
    AgentError,
    Approval,
    Continuation,
    KeyHeader,
    ToolIntent,
    ToolResult,
    TraceEvent,
    canonical_json,
    submission_digest,
    withdrawal_id_for,
)
from beam_agents.core.agent import (
    ActivationTimeoutError,
    BudgetExceeded,
    BudgetExceededError,
    Complete,
    ErrorReason,
    FallbackContext,
    InvalidOutcomeError,
    Outcome,
    Suspend,
    epoch_clock,
    intent_id_for,
)
from beam_agents.core.config import (
    TRIGGER_APPROVAL,
    TRIGGER_DEADLINE,
    TRIGGER_EVENT,
    TRIGGER_IDLE,
    TRIGGER_TOOL_RESULT,
    AgentConfig,
    CommitInfo,
    Deny,
    Drop,
    Escalate,
    HitlPolicy,
    Route,
    record_options,
)
from beam_agents.core.context import ActivationContext, AgentFn, staged, staged_anything
from beam_agents.core.observability import (
    DEADLINE_ATTRIBUTE,
    ActivationRecorder,
    TraceRecorder,
    explain,
)
from beam_agents.core.staging import (
    APPROVAL_TOOL_NAME,
    ActivationServices,
    Resumption,
    Staged,
    StepCursor,
    StepRecord,
    run_namespace,
    stage_route_compensations,
    stale_approval,
)
from beam_agents.core.state import HEADER_SCHEMA_VERSION, KeyState
from beam_agents.model.client import ProviderError


class Plan:
    """State writes, timers and outputs of one ``process`` or timer call on one key."""

    __slots__ = (
        "deadline_ms",
        "early",
        "errors",
        "idle_ms",
        "intents",
        "outputs",
        "records",
        "state",
        "traces",
    )

    def __init__(self, state: KeyState) -> None:
        self.state = state
        self.outputs: list[bytes] = []
        self.intents: list[ToolIntent] = []
        self.traces: list[TraceEvent] = []
        self.errors: list[AgentError] = []
        self.records: Sequence[ActivationRecord] = ()
        self.deadline_ms: int | None = None
        """``None``: leave the deadline timer as it is; ``0``: clear it; else set it (ms)."""
        self.idle_ms: int | None = None
        """``None``: leave the idle timer as it is; else set it (event time, ms)."""
        self.early = False
        """A deadline timer fired before its time and was re-armed: nothing else happened."""


@dataclass(frozen=True, slots=True)
class TimerFired:
    """A key's timer fired: ``timer`` is ``"deadline"`` or ``"idle"``, at ``fired_ms``."""

    timer: str
    fired_ms: int


Received: TypeAlias = AgentEnvelope | TimerFired
"""What an activation is given: an envelope (event, tool result, approval) or a timer firing."""


def error_record(
    entity_key: bytes,
    reason: ErrorReason,
    detail: str,
    event_time_ms: int,
    envelope: bytes,
    seq: int,
    *,
    traceback: str = "",
    trace_id: str = "",
) -> AgentError:
    """An ``.errors`` record (``envelope``: the original envelope's bytes, if any).

    ``trace_id``: the trace id of the run the error belongs to ("" for none).
    """
    return AgentError(
        entity_key=entity_key,
        reason=reason.value,
        detail=detail,
        event_time_ms=event_time_ms,
        envelope=envelope,
        seq=seq,
        traceback=traceback,
        trace_id=trace_id,
    )


RunCoroutine = Callable[[Coroutine[Any, Any, Any], float], Any]
"""Drives an agent's coroutine to its end within a timeout (``CoroutineDriver.run``)."""


def _no_committed_calls() -> None:
    """A new run's replay cache starts empty, without reading the cell (``KeyState.read_cache``)."""
    return None


class Activator:
    """Decides, for one agent and config, what each element and timer does to a key.

    ``ticks``: the deadline timer is a tick at which the run's deadline is checked, not a timer
    set for it (``docs/concepts/runtime.md``, "Clocks"). ``bounded``: the input ends, so a
    suspension the agent gave no timeout gets no implicit deadline either (the pipeline's end
    is its end).
    """

    def __init__(
        self,
        agent: AgentFn,
        config: AgentConfig,
        services: ActivationServices,
        run: RunCoroutine,
        *,
        ticks: bool = False,
        bounded: bool = False,
        traced: bool = True,
    ) -> None:
        self._agent = agent
        self._traced = traced
        self._ticks = ticks
        self._bounded = bounded
        self._config = config
        self._services = services
        self._run = run
        clock = config.processing_clock
        self._clock = time.time if clock is None else clock
        # Every clock but the test clock tells the runner's current time.
        self._clock_readable = clock is not epoch_clock
        self._record = record_options(config.record)
        # A new run that stages nothing commits its header alone (``_new_run``).
        self._header_only_commits = (
            not traced and self._record is None and config.before_commit is None
        )

    def activate(self, key: bytes, received: Received, state: KeyState) -> Plan:
        """What ``received`` does to the key: one ``_apply_<kind>`` per kind of input."""
        plan = Plan(state)
        if isinstance(received, TimerFired):
            if received.timer == TRIGGER_DEADLINE:
                self._apply_deadline(plan, key, received.fired_ms)
            else:
                self._apply_idle(plan, key, received.fired_ms)
            return plan
        kind = received.WhichOneof("payload")
        if kind == "external_event":
            self._apply_external_event(plan, key, received)
        elif kind == "tool_result":
            self._apply_answer(plan, key, received, received.tool_result, TRIGGER_TOOL_RESULT)
        else:
            self._apply_answer(plan, key, received, received.approval, TRIGGER_APPROVAL)
        return plan

    # -- envelopes -----------------------------------------------------------------------

    def _apply_external_event(self, plan: Plan, key: bytes, envelope: AgentEnvelope) -> None:
        """Start a run, or buffer the event while the key's run is suspended."""
        if plan.state.continuation is None:
            self._new_run(plan, key, envelope, None)
        else:
            self._buffer_event(plan, key, envelope)

    def _new_run(
        self, plan: Plan, key: bytes, envelope: AgentEnvelope, envelope_bytes: bytes | None
    ) -> None:
        state = plan.state
        seq = state.header.next_seq
        now_ms = envelope.event_time_ms
        namespace = self._services.intent_namespace
        trace = TraceRecorder(key, seq, None, 0, now_ms, namespace=namespace, enabled=self._traced)
        ctx = ActivationContext(
            entity_key=key,
            seq=seq,
            now_ms=now_ms,
            event=envelope.external_event,
            first_step=0,
            trace=trace,
            services=self._services,
            load_memory=state.read_memory,
            load_cache=_no_committed_calls,
        )
        outcome = self._activate(plan, ctx, trace, TRIGGER_EVENT, envelope, envelope_bytes)
        if outcome is None:
            return
        if self._header_only_commits and not staged_anything(ctx) and type(outcome) is Complete:
            state.write_header(self._next_header(plan, seq + 1, now_ms))
            if outcome.output:
                plan.outputs.append(outcome.output)
            return
        self._commit(plan, ctx, staged(ctx), outcome, TRIGGER_EVENT, None)

    def _buffer_event(self, plan: Plan, key: bytes, envelope: AgentEnvelope) -> None:
        state = plan.state
        suspended = state.continuation
        assert suspended is not None
        limit = self._config.max_buffered_events
        if state.buffered_count() >= limit:
            plan.errors.append(
                error_record(
                    key,
                    ErrorReason.BUFFER_OVERFLOW,
                    f"{limit} external events are already waiting for suspended run seq "
                    f"{suspended.seq} of this key; raise AgentConfig.max_buffered_events or resume "
                    "the run sooner",
                    envelope.event_time_ms,
                    envelope.SerializeToString(),
                    suspended.seq,
                    trace_id=suspended.trace_id,
                )
            )
            return
        state.buffer(envelope.SerializeToString())
        if not state.header.last_activity_ms:
            self._arm_idle(plan, envelope.event_time_ms)

    def _apply_answer(
        self,
        plan: Plan,
        key: bytes,
        envelope: AgentEnvelope,
        answer: ToolResult | Approval,
        trigger: str,
    ) -> None:
        """Resume the suspended run with a tool result or an approval, or refuse it."""
        state = plan.state
        suspended = state.continuation
        reason = ErrorReason.ORPHANED_RESULT
        refusal = answer_refusal(key, suspended, answer, self.processing_ms)
        if refusal is None and suspended is not None and isinstance(answer, Approval):
            reason, refusal = ErrorReason.STALE_APPROVAL, stale_approval(key, suspended, answer)
        if refusal is not None:
            plan.errors.append(
                error_record(
                    key,
                    reason,
                    refusal,
                    envelope.event_time_ms,
                    envelope.SerializeToString(),
                    state.header.next_seq if suspended is None else suspended.seq,
                    trace_id=_trace_of_answer(suspended, answer.intent_id),
                )
            )
            return
        assert suspended is not None
        answered = with_answer(suspended, answer)
        now_ms = envelope.event_time_ms
        trace = TraceRecorder(
            key,
            answered.seq,
            answered.trace_id,
            answered.trace_sequence,
            now_ms,
            namespace=run_namespace(answered),
            enabled=self._traced,
        )
        ctx = ActivationContext(
            entity_key=key,
            seq=answered.seq,
            now_ms=now_ms,
            event=b"",
            first_step=answered.next_step,
            trace=trace,
            services=self._services,
            load_memory=state.read_memory,
            load_cache=state.read_cache,
            resumption=resumption(answered, answer),
        )
        outcome = self._activate(plan, ctx, trace, trigger, envelope, None)
        if outcome is not None:
            self._commit(plan, ctx, staged(ctx), outcome, trigger, answered)

    # -- activation and commit -----------------------------------------------------------

    def _activate(
        self,
        plan: Plan,
        ctx: ActivationContext,
        trace: TraceRecorder,
        trigger: str,
        envelope: AgentEnvelope,
        envelope_bytes: bytes | None,
    ) -> Outcome | None:
        """Run the agent; on failure plan the error and its trace and return ``None``."""
        if self._record is not None:
            staged(ctx).recording = ActivationRecorder(
                self._record, envelope, trigger, ctx.high_water_step
            )
        trace.record(TraceEvent.ACTIVATION_START, ctx.high_water_step, {"trigger": trigger})
        failure: BaseException
        try:
            outcome = self._run(self._agent(ctx), self._config.activation_timeout_s)
            return self._checked(outcome, ctx)
        except (Exception, asyncio.CancelledError) as exc:
            failure = exc
        reason = _failure_reason(failure)
        detail, failure_traceback = explain(failure, self._agent)
        plan.traces.append(
            trace.failure(
                ctx.high_water_step, {"reason": reason.value, "error": type(failure).__name__}
            )
        )
        plan.errors.append(
            error_record(
                ctx.entity_key,
                reason,
                detail,
                envelope.event_time_ms,
                envelope.SerializeToString() if envelope_bytes is None else envelope_bytes,
                ctx.seq,
                traceback=failure_traceback,
                trace_id=trace.trace_id,
            )
        )
        return None

    def _checked(self, outcome: object, ctx: ActivationContext) -> Outcome:
        budget_error = staged(ctx).budget_error if staged_anything(ctx) else None
        if budget_error is not None:  # the agent caught it, but the run must not commit
            raise budget_error
        if isinstance(outcome, Complete):
            if not isinstance(outcome.output, bytes):
                raise InvalidOutcomeError(
                    f"Complete.output must be bytes, got {type(outcome.output).__name__}"
                )
            return outcome
        if isinstance(outcome, Suspend):
            if not staged(ctx).pending_after() and self._suspension_timeout(outcome) is None:
                raise InvalidOutcomeError(
                    "the agent suspended with no pending intents and no timeout, so nothing "
                    "could ever resume it; stage an intent first, set Suspend(timeout_ms=...), "
                    "or return Complete"
                )
            return outcome
        raise InvalidOutcomeError(
            f"an agent must return Complete or Suspend, got {type(outcome).__name__}"
        )

    def _commit(
        self,
        plan: Plan,
        ctx: ActivationContext,
        staged: Staged,
        outcome: Outcome,
        trigger: str,
        base: Continuation | None,
    ) -> None:
        """Plan a successful activation's state, timers and outputs (``base``: the resumed run)."""
        state = plan.state
        timeout = self._suspension_timeout(outcome) if isinstance(outcome, Suspend) else None
        if timeout is not None:
            bound_approvals(staged.intents, timeout)
        if staged.recording is not None:  # first: it reads the state this commit replaces
            recorded = staged.recording.finish(ctx.entity_key, ctx.seq, staged, outcome, state)
            plan.records = (*plan.records, recorded)
        was_suspended = state.continuation is not None
        suspended: Continuation | None = None
        if isinstance(outcome, Suspend):
            suspended = suspend(
                base,
                staged,
                seq=ctx.seq,
                started_at_ms=ctx.now_ms,
                snapshot=outcome.snapshot,
                adapter=outcome.adapter,
                deadline_ms=self._suspension_deadline(timeout, staged, base),
            )
        else:
            staged.trace.record(
                TraceEvent.ACTIVATION_END,
                staged.cursor.high_water_step,
                staged.closing_attributes({"output_bytes": str(len(outcome.output))})
                if self._traced
                else None,
            )
        if self._config.before_commit is not None:
            first_step = 0 if base is None else base.next_step
            self._before_commit(ctx.entity_key, ctx.seq, trigger, first_step)
        memory = staged.memory
        if memory is not None and memory.changed:
            state.write_memory(memory.encode())
        header = self._next_header(plan, max(state.header.next_seq, ctx.seq + 1), ctx.now_ms)
        if suspended is not None:
            cache = staged.cache
            if cache is not None and cache.changed:
                suspended.replay_cache = cache.encode()
            state.write_continuation(suspended, header)
            plan.deadline_ms = suspended.deadline_ms
        elif was_suspended:
            state.end_run(header)
            plan.deadline_ms = 0
        else:
            state.write_header(header)
        if isinstance(outcome, Complete) and base is not None:
            plan.intents.extend(
                withdrawals(ctx.entity_key, base, awaited(base), COMPLETED, ctx.now_ms)
            )
        if staged.intents:
            plan.intents.extend(staged.intents)
        if staged.debits:
            plan.intents.extend(staged.debits)
        plan.traces.extend(staged.trace.events)
        if isinstance(outcome, Complete):
            if outcome.output:
                plan.outputs.append(outcome.output)
            if was_suspended:
                self._drain(plan, ctx.entity_key)

    def _suspension_timeout(self, outcome: Suspend) -> int | None:
        if outcome.timeout_ms is not None:
            return outcome.timeout_ms
        policy = self._config.hitl_policy
        return None if policy is None else policy.timeout_ms

    def _suspension_deadline(
        self, timeout: int | None, staged: Staged, base: Continuation | None
    ) -> int:
        """The processing-time deadline of a suspension (0: none, only in a bounded pipeline).

        Without a timeout it is the longest TTL window of the pending intents plus
        ``AgentConfig.result_grace_ms``, and never earlier than the run's previous deadline.
        """
        now_ms = self.processing_ms()
        if timeout is not None:
            return now_ms + timeout
        if self._bounded:
            return 0
        default_ttl_ms = self._config.intent_ttl_ms
        windows = [
            intent.expires_at_ms - intent.created_at_ms if intent.expires_at_ms else default_ttl_ms
            for intent in staged.intents
        ]
        earlier_ms = 0 if base is None else base.deadline_ms
        if staged.carried and not earlier_ms:
            windows.append(default_ttl_ms)  # their windows are not kept: assume the default
        longest = max(windows, default=0)
        return max(earlier_ms, now_ms + longest + self._config.result_grace_ms)

    def processing_ms(self) -> int:
        """Now, in milliseconds, on the clock deadlines are placed on."""
        return int(self._clock() * 1000)

    def _before_commit(self, key: bytes, seq: int, trigger: str, first_step: int) -> None:
        hook = self._config.before_commit
        if hook is not None:
            hook(CommitInfo(entity_key=key, seq=seq, trigger=trigger, first_step=first_step))

    def _next_header(self, plan: Plan, next_seq: int, activity_ms: int) -> KeyHeader:
        """The header to store (the caller stores it); arm the idle timer if none is armed."""
        previous_ms = plan.state.header.last_activity_ms  # waiting events fold theirs in later
        if not previous_ms:
            self._arm_idle(plan, activity_ms)
        header = KeyHeader()  # field by field: cheaper than keywords
        header.schema_version = HEADER_SCHEMA_VERSION
        header.next_seq = next_seq
        header.last_activity_ms = max(previous_ms, activity_ms)
        return header

    def _arm_idle(self, plan: Plan, activity_ms: int) -> None:
        """Arm the idle timer of a key whose last activity is zero: it has none armed.

        A zero last activity means a fresh or cleaned-up key; an armed timer that fires early
        re-arms itself, so it need not move on every element.
        """
        ttl_ms = self._config.ttl_ms
        if ttl_ms is not None:
            plan.idle_ms = max(0, activity_ms) + ttl_ms

    def _drain(self, plan: Plan, key: bytes) -> None:
        """Run the events buffered during a suspension that just ended, until one suspends."""
        state = plan.state
        waiting = state.buffered()
        if not waiting:
            return
        while waiting and state.continuation is None:
            envelope_bytes = waiting.pop(0)
            self._new_run(plan, key, AgentEnvelope.FromString(envelope_bytes), envelope_bytes)
        state.replace_buffer(waiting)

    # -- timers --------------------------------------------------------------------------

    def _apply_deadline(self, plan: Plan, key: bytes, fired_ms: int) -> None:
        """A suspension reached its deadline: take the HITL timeout route."""
        state = plan.state
        suspended = state.continuation
        if suspended is None or not suspended.deadline_ms:
            return  # a timer left over from a run that has since ended
        if self._ticks:
            fired_ms = suspended.deadline_ms  # a tick: check the deadline the run has now
        elif suspended.deadline_ms != fired_ms:
            return  # a timer left over from a suspension that has since moved on
        if self._clock_readable and self.processing_ms() < fired_ms:
            plan.deadline_ms = fired_ms  # fired early (a local runner's bundle ended): re-arm
            plan.early = True
            return
        policy = self._config.hitl_policy
        route = choose_route(policy, key, suspended, fired_ms)
        self._before_commit(key, suspended.seq, TRIGGER_DEADLINE, suspended.next_step)
        now_ms = state.last_activity_ms
        taken = deadline_outcome(
            route, key, suspended, policy, fired_ms=fired_ms, now_ms=now_ms, traced=self._traced
        )
        plan.traces.extend(taken.traces)
        plan.outputs.extend(taken.outputs)
        plan.errors.extend(taken.errors)
        plan.intents.extend(taken.withdrawals)
        plan.intents.extend(taken.compensations)
        if taken.escalated is None:
            state.end_run()
            plan.deadline_ms = 0
            self._drain(plan, key)
        else:
            assert taken.intent is not None
            state.write_continuation(taken.escalated)
            plan.deadline_ms = taken.escalated.deadline_ms
            plan.intents.append(taken.intent)

    def _apply_idle(self, plan: Plan, key: bytes, fired_ms: int) -> None:
        """Clear an idle key's state, keeping its header so identifiers never repeat."""
        state = plan.state
        ttl_ms = self._config.ttl_ms
        current = state.header
        last_activity_ms = state.last_activity_ms
        expires_ms = idle_expiry(last_activity_ms, ttl_ms)
        if expires_ms is None or ttl_ms is None:  # (ttl_ms for the type checker)
            return
        if expires_ms > fired_ms:
            plan.idle_ms = expires_ms
            return
        if self._ticks and self._clock_readable and self.processing_ms() < expires_ms:
            # The FnApiRunner fires event-time timers whenever a bundle round ends, whatever
            # the reader's watermark says. Not due on the clock: keep the key. Re-arming would
            # fire again every round, and a pipeline whose input has ended would never finish.
            return
        wiped = state.continuation
        self._before_commit(key, current.next_seq, TRIGGER_IDLE, current.next_seq)
        state.wipe()
        state.write_header(
            KeyHeader(schema_version=HEADER_SCHEMA_VERSION, next_seq=current.next_seq)
        )
        if wiped is not None:
            plan.deadline_ms = 0
            reason = f"{WIPED}: the key was idle for {ttl_ms} ms"
            at_ms = last_activity_ms
            plan.intents.extend(withdrawals(key, wiped, awaited(wiped), reason, at_ms))
            detail = (
                f"run seq {wiped.seq} was still suspended, waiting for "
                f"{len(wiped.pending_intent_ids)} intents, when the key's state was cleaned up "
                f"after {ttl_ms} ms without activity"
            )
            plan.errors.append(
                error_record(
                    key,
                    ErrorReason.SUSPENSION_WIPED,
                    detail,
                    last_activity_ms,
                    b"",
                    wiped.seq,
                    trace_id=wiped.trace_id,
                )
            )
            self._drain(plan, key)


def _failure_reason(failure: BaseException) -> ErrorReason:
    if isinstance(failure, ActivationTimeoutError):
        return ErrorReason.ACTIVATION_TIMEOUT
    if isinstance(failure, BudgetExceededError | BudgetExceeded):
        return ErrorReason.BUDGET_EXCEEDED
    if isinstance(failure, ProviderError):
        return ErrorReason.MODEL_ERROR
    return ErrorReason.ACTIVATION_ERROR


# -- the continuation: the one owner of every change to a suspended run -----------------------
# Each change returns a new Continuation (the committed one is never edited in place), so a
# failed activation leaves the key's state as it was. The parallel pending lists and the step
# records are edited only here.
DEADLINE_APPROVER = "beam-agents/deadline"
"""The ``approver`` recorded when a suspension's deadline answers a pending approval "no"."""


def _trace_of_answer(suspended: Continuation | None, intent_id: str) -> str:
    """The trace of the suspended run if ``intent_id`` is one of its intents, else ``""``."""
    if suspended is None:
        return ""
    ours = (
        intent_id in suspended.pending_intent_ids
        or intent_id in suspended.answered_intent_ids
        or intent_id in suspended.submission_digests
    )
    return suspended.trace_id if ours else ""


def pending_of(continuation: Continuation) -> list[tuple[str, int]]:
    """The run's unanswered ``(intent_id, kind)`` pairs, in staging order."""
    return list(zip(continuation.pending_intent_ids, continuation.pending_kinds, strict=True))


def pending_kind(continuation: Continuation, intent_id: str) -> int:
    """The ``ToolIntent.Kind`` of the pending intent ``intent_id``."""
    return continuation.pending_kinds[list(continuation.pending_intent_ids).index(intent_id)]


def with_answer(suspended: Continuation, answer: ToolResult | Approval) -> Continuation:
    """The run with ``answer`` (to one of its pending intents) applied."""
    answered = _copy(suspended)
    pending = pending_of(suspended)
    del pending[[intent_id for intent_id, _ in pending].index(answer.intent_id)]
    _set_pending(answered, pending)
    _answer(answered, answer)
    return answered


def resumption(answered: Continuation, answer: ToolResult | Approval) -> Resumption:
    """What the activation that ``answer`` starts resumes from (``answered`` includes it)."""
    is_approval = isinstance(answer, Approval)
    return Resumption(
        result=None if is_approval else answer,  # type: ignore[arg-type]
        approval=answer if is_approval else None,  # type: ignore[arg-type]
        snapshot=answered.snapshot,
        results={result.intent_id: result for result in answered.results},
        pending=tuple(pending_of(answered)),
        tokens_used=answered.tokens_used,
        steps=answered.steps,
        namespace=run_namespace(answered),
        approvals={approval.intent_id: approval for approval in answered.approvals},
        compensations=answered.compensations,
    )


def suspend(
    base: Continuation | None,
    staged: Staged,
    *,
    seq: int,
    started_at_ms: int,
    snapshot: bytes,
    adapter: str,
    deadline_ms: int,
) -> Continuation:
    """The continuation a ``Suspend`` persists, and its ``SUSPENDED`` trace.

    ``base`` is the resumed run with its answer applied, or ``None`` for a new run.
    """
    pending = staged.pending_after()
    next_step = staged.cursor.high_water_step
    attributes = {"pending": str(len(pending))}
    if deadline_ms:
        attributes[DEADLINE_ATTRIBUTE] = str(deadline_ms)
    staged.trace.record(TraceEvent.SUSPENDED, next_step, staged.closing_attributes(attributes))
    suspended = Continuation(started_at_ms=started_at_ms) if base is None else _copy(base)
    suspended.seq = seq
    _append_steps(suspended, staged.cursor.new_steps)
    suspended.next_step = next_step
    suspended.snapshot = snapshot
    suspended.adapter = adapter
    _set_pending(suspended, pending)
    awaited = {intent_id for intent_id, _ in pending}
    digests = suspended.submission_digests
    for intent in staged.intents:
        if intent.intent_id in awaited:
            digests[intent.intent_id] = submission_digest(intent)
    suspended.deadline_ms = deadline_ms
    suspended.trace_id = staged.trace.trace_id
    suspended.tokens_used = suspended.tokens_used + staged.tokens_used
    suspended.trace_sequence = staged.trace.next_sequence
    suspended.intent_namespace = staged.namespace or ""
    del suspended.compensations[:]
    suspended.compensations.extend(staged.links)
    return suspended


def escalate(
    suspended: Continuation,
    trace: TraceRecorder,
    *,
    fired_ms: int,
    timeout_ms: int,
    intent_ttl_ms: int,
    channel: str,
    required_approvals: int = 1,
) -> tuple[Continuation, ToolIntent]:
    """Answer pending approvals "no" (by the deadline), ask again, and re-suspend.

    Returns the re-suspended continuation and the fresh ``APPROVAL`` intent it waits for.
    """
    escalated = _copy(suspended)
    pending = pending_of(suspended)
    superseded = [intent_id for intent_id, kind in pending if kind == ToolIntent.APPROVAL]
    kept = [(intent_id, kind) for intent_id, kind in pending if kind != ToolIntent.APPROVAL]
    step = suspended.next_step
    args_json = canonical_json(
        {
            "escalation": suspended.escalations + 1,
            "supersedes": superseded,
            "pending_intent_ids": [pending_id for pending_id, _ in kept],
        }
    )
    asked = Staged(trace, StepCursor(step), namespace=run_namespace(suspended))
    asked.stage_intent(
        ToolIntent.APPROVAL,
        APPROVAL_TOOL_NAME,
        args_json,
        intent_ttl_ms,
        channel,
        required_approvals=required_approvals,
    )
    [intent] = asked.intents
    bound_approvals(asked.intents, timeout_ms)
    for intent_id in superseded:
        _answer(
            escalated,
            Approval(
                intent_id=intent_id,
                approved=False,
                approver=DEADLINE_APPROVER,
                decided_at_ms=fired_ms,
                reason="no decision before the deadline; escalated",
                superseded_by=intent.intent_id,
            ),
        )
    escalation_steps = asked.cursor.new_steps
    _append_steps(escalated, [(StepRecord.ESCALATION, digest) for _, digest in escalation_steps])
    kept.append((intent.intent_id, ToolIntent.APPROVAL))
    escalated.submission_digests[intent.intent_id] = submission_digest(intent)
    escalated.deadline_ms = fired_ms + timeout_ms
    trace.record(
        TraceEvent.SUSPENDED,
        step + 1,
        {
            "pending": str(len(kept)),
            "route": "escalate",
            DEADLINE_ATTRIBUTE: str(escalated.deadline_ms),
        },
    )
    _set_pending(escalated, kept)
    escalated.next_step = step + 1
    escalated.escalations = suspended.escalations + 1
    escalated.trace_sequence = trace.next_sequence
    return escalated, intent


# -- withdrawals: what a run that leaves a suspension no longer waits for ----------------------
COMPLETED = "the run completed without waiting for it"
DENIED = "the run's deadline passed and its timeout route denied it"
DROPPED = "the run's deadline passed and its timeout route dropped it"
ROUTE_FAILED = "the run's deadline passed and its timeout route failed; the run ended undecided"
ESCALATED = "the approval timed out and was escalated: a new approval request replaces it"
WIPED = "the run was wiped by idle-key cleanup while it waited"


def awaited(run: Continuation) -> list[str]:
    """The intents ``run`` still waits for: its pending ones but compensations (never awaited)."""
    compensations = {link.compensation_intent_id for link in run.compensations}
    return [intent_id for intent_id in run.pending_intent_ids if intent_id not in compensations]


def withdrawals(
    key: bytes, run: Continuation, targets: Sequence[str], reason: str, at_ms: int
) -> list[ToolIntent]:
    """One ``WITHDRAWAL`` intent per id in ``targets``: ``run`` no longer waits for them.

    A pure function of its arguments, so a retried bundle mints the same bytes.
    """
    if not targets:
        return []
    steps = _steps_of(key, run, set(targets))
    args_json = canonical_json({"reason": reason})
    return [
        ToolIntent(
            intent_id=withdrawal_id_for(target),
            entity_key=key,
            seq=run.seq,
            step_index=steps.get(target, 0),
            tool_name="",
            args_json=args_json,
            created_at_ms=at_ms,
            expires_at_ms=0,
            kind=ToolIntent.WITHDRAWAL,
            trace_id=run.trace_id,
            withdraws_intent_id=target,
        )
        for target in targets
    ]


def _steps_of(key: bytes, run: Continuation, wanted: set[str]) -> dict[str, int]:
    """The step each id in ``wanted`` was staged at by ``run`` (ids are minted from steps)."""
    namespace = run_namespace(run)
    found: dict[str, int] = {}
    for step in range(max(run.next_step, len(run.steps))):
        intent_id = intent_id_for(key, run.seq, step, namespace)
        if intent_id in wanted:
            found[intent_id] = step
            if len(found) == len(wanted):
                break
    return found


def bound_approvals(intents: Iterable[ToolIntent], timeout_ms: int) -> None:
    """Make no ``APPROVAL`` intent outlive the suspension's ``timeout_ms`` (in place)."""
    for intent in intents:
        if intent.kind == ToolIntent.APPROVAL:
            bound = intent.created_at_ms + timeout_ms
            if not intent.expires_at_ms or intent.expires_at_ms > bound:
                intent.expires_at_ms = bound


def timed_out_approval(suspended: Continuation, intent_id: str) -> bool:
    """Whether the deadline answered the approval ``intent_id`` (it was escalated)."""
    return any(
        approval.intent_id == intent_id and approval.approver == DEADLINE_APPROVER
        for approval in suspended.approvals
    )


def _copy(continuation: Continuation) -> Continuation:
    copied = Continuation()
    copied.CopyFrom(continuation)
    return copied


def _answer(continuation: Continuation, answer: ToolResult | Approval) -> None:
    continuation.answered_intent_ids.append(answer.intent_id)
    if isinstance(answer, Approval):
        continuation.approvals.append(answer)
    else:
        continuation.results.append(answer)


def _set_pending(continuation: Continuation, pending: Iterable[tuple[str, int]]) -> None:
    pairs = list(pending)
    del continuation.pending_intent_ids[:]
    del continuation.pending_kinds[:]
    continuation.pending_intent_ids.extend(intent_id for intent_id, _ in pairs)
    continuation.pending_kinds.extend(kind for _, kind in pairs)  # type: ignore[misc]


def _append_steps(continuation: Continuation, steps: Iterable[tuple[int, bytes]]) -> None:
    """Record the run's fresh steps after those it recorded before (one record per step)."""
    continuation.steps.extend(
        StepRecord(kind=kind, digest=digest)  # type: ignore[arg-type]
        for kind, digest in steps
    )


# -- admission: which inputs may reach a run --------------------------------------------------
def element_problem(element: Any) -> AgentError | None:
    """The ``.errors`` record for a malformed input element, or ``None`` if it is well formed."""
    if not (isinstance(element, tuple) and len(element) == 2):
        return error_record(
            b"",
            ErrorReason.MALFORMED_ELEMENT,
            f"expected a (bytes, AgentEnvelope) pair, got {type(element).__name__}",
            0,
            b"",
            0,
        )
    key, envelope = element
    if not isinstance(envelope, AgentEnvelope):
        return error_record(
            key if isinstance(key, bytes) else b"",
            ErrorReason.MALFORMED_ELEMENT,
            f"expected an AgentEnvelope value, got {type(envelope).__name__}",
            0,
            b"",
            0,
        )
    if not isinstance(key, bytes):
        reason, detail = (
            ErrorReason.MALFORMED_ELEMENT,
            f"expected a bytes key, got {type(key).__name__}",
        )
    elif not key:
        reason, detail = ErrorReason.EMPTY_KEY, "the element's key is empty"
    elif envelope.entity_key != key:
        reason, detail = (
            ErrorReason.KEY_MISMATCH,
            f"the element's key {key!r} differs from the envelope's entity_key "
            f"{envelope.entity_key!r}",
        )
    elif envelope.WhichOneof("payload") is None:
        reason, detail = (
            ErrorReason.MISSING_PAYLOAD,
            "the envelope has no external_event, tool_result or approval",
        )
    else:
        return None
    return error_record(
        key if isinstance(key, bytes) else b"",
        reason,
        detail,
        envelope.event_time_ms,
        envelope.SerializeToString(),
        0,
    )


def answer_refusal(
    key: bytes,
    suspended: Continuation | None,
    answer: ToolResult | Approval,
    processing_ms: Callable[[], int],
) -> str | None:
    """Why ``answer`` cannot resume this key's run, or ``None`` if it is admitted.

    ``processing_ms`` is read only when every other rule passed and the run has a deadline.
    """
    is_approval = isinstance(answer, Approval)
    what = "approval" if is_approval else "tool result"
    intent_id = answer.intent_id
    if suspended is None:
        return (
            f"no suspended run on this key to take the {what} for intent {intent_id!r}: the "
            "key never suspended, its run already ended, or its state was cleaned up"
        )
    if isinstance(answer, ToolResult) and answer.entity_key and answer.entity_key != key:
        return f"the {what} for intent {intent_id!r} names another key, {answer.entity_key!r}"
    if intent_id in suspended.answered_intent_ids:
        if timed_out_approval(suspended, intent_id):
            return (
                f"the {what} for intent {intent_id!r} arrived after the deadline: the "
                "request timed out and was escalated"
            )
        return f"duplicate delivery: the {what} for intent {intent_id!r} was already applied"
    if intent_id not in suspended.pending_intent_ids:
        return (
            f"intent {intent_id!r} is not pending in this key's suspended run (seq {suspended.seq})"
        )
    # An approval intent may also end with a ToolResult (the effector reports it EXPIRED or
    # REJECTED), but a tool intent is never answered by an approval.
    if is_approval and pending_kind(suspended, intent_id) != ToolIntent.APPROVAL:
        return f"intent {intent_id!r} is a tool intent and cannot take an approval"
    refused = isinstance(answer, ToolResult) and answer.refused_submission_digest
    if refused and suspended.submission_digests.get(intent_id) != refused:
        return (
            f"the REJECTED result for intent {intent_id!r} answers another submission of that "
            "id, refused as a conflict; this run's own submission was kept (do two pipelines "
            "share the effector without AgentConfig.namespace?)"
        )
    if suspended.deadline_ms and processing_ms() >= suspended.deadline_ms:
        return (
            f"the {what} for intent {intent_id!r} arrived after the deadline "
            f"({suspended.deadline_ms} ms); the timeout route decides this run"
        )
    return None


# -- timer routes: a timed-out suspension and an idle key -------------------------------------
# Pure functions of the key's state and the timer's firing time: neither reads a clock.
@dataclass(slots=True)
class DeadlineOutcome:
    """What a timed-out suspension does: end the run (``escalated is None``) or re-suspend."""

    traces: list[TraceEvent]
    outputs: list[bytes] = field(default_factory=list)
    errors: list[AgentError] = field(default_factory=list)
    escalated: Continuation | None = None
    intent: ToolIntent | None = None
    compensations: list[ToolIntent] = field(default_factory=list)
    """What a ``Deny(compensate=True)`` staged: the run's effects undone, newest first."""
    withdrawals: list[ToolIntent] = field(default_factory=list)
    """One ``WITHDRAWAL`` per intent the run stopped waiting for."""


def fallback_context(key: bytes, suspended: Continuation, fired_ms: int) -> FallbackContext:
    """What the timeout route decides on: a pure function of the key's state and the timer."""
    return FallbackContext(
        entity_key=key,
        seq=suspended.seq,
        snapshot=suspended.snapshot,
        deadline_ms=suspended.deadline_ms,
        fired_at_ms=fired_ms,
        pending_intent_ids=frozenset(suspended.pending_intent_ids),
    )


class RouteFailure:
    """The timeout route raised instead of deciding: the run ends without a decision."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


def choose_route(
    policy: HitlPolicy | None, key: bytes, suspended: Continuation, fired_ms: int
) -> Route | RouteFailure:
    """The policy's route for the timed-out run (``Drop`` without a policy), or its failure."""
    if policy is None:
        return Drop()
    try:
        return policy.decide(fallback_context(key, suspended, fired_ms), suspended.escalations)
    except Exception as exc:
        return RouteFailure(exc)


def deadline_outcome(
    route: Route | RouteFailure,
    key: bytes,
    suspended: Continuation,
    policy: HitlPolicy | None,
    *,
    fired_ms: int,
    now_ms: int,
    traced: bool = True,
) -> DeadlineOutcome:
    """Apply ``route`` to the timed-out run ``suspended`` (``now_ms``: the key's last activity).

    ``traced``: whether to build its trace events (``AgentConfig.traces``).
    """
    step = suspended.next_step
    trace = TraceRecorder(
        key,
        suspended.seq,
        suspended.trace_id,
        suspended.trace_sequence,
        now_ms,
        namespace=run_namespace(suspended),
        enabled=traced,
    )
    trace.record(TraceEvent.ACTIVATION_START, step, {"trigger": TRIGGER_DEADLINE})
    if isinstance(route, RouteFailure):
        failure = f"{type(route.error).__name__}: {route.error}"
        attributes = {"reason": ErrorReason.TIMEOUT_ROUTE_ERROR.value, "error": failure}
        explained, failure_traceback = explain(
            route.error, None if policy is None else policy.on_timeout
        )
        detail = (
            f"the on_timeout route failed ({explained}); the run was ended without a decision "
            "(fail closed)"
        )
        error = error_record(
            key,
            ErrorReason.TIMEOUT_ROUTE_ERROR,
            detail,
            now_ms,
            b"",
            suspended.seq,
            traceback=failure_traceback,
            trace_id=suspended.trace_id,
        )
        return DeadlineOutcome(
            traces=[trace.failure(step, attributes)],
            errors=[error],
            withdrawals=withdrawals(key, suspended, awaited(suspended), ROUTE_FAILED, now_ms),
        )
    if isinstance(route, Escalate):
        assert policy is not None
        escalated, intent = escalate(
            suspended,
            trace,
            fired_ms=fired_ms,
            timeout_ms=policy.timeout_ms,
            intent_ttl_ms=policy.intent_ttl_ms,
            channel=policy.approval_channel,
            required_approvals=policy.required_approvals,
        )
        replaced = [
            intent_id
            for intent_id, kind in pending_of(suspended)
            if kind == ToolIntent.APPROVAL and intent_id not in escalated.pending_intent_ids
        ]
        return DeadlineOutcome(
            traces=trace.events,
            escalated=escalated,
            intent=intent,
            withdrawals=withdrawals(key, suspended, replaced, ESCALATED, now_ms),
        )
    denied = isinstance(route, Deny)
    compensations = []
    if isinstance(route, Deny) and route.compensate:
        compensations = stage_route_compensations(suspended, trace)
        step += len(compensations)
    trace.record(TraceEvent.ACTIVATION_END, step, {"route": "deny" if denied else "drop"})
    outcome = DeadlineOutcome(
        traces=trace.events,
        compensations=compensations,
        withdrawals=withdrawals(
            key, suspended, awaited(suspended), DENIED if denied else DROPPED, now_ms
        ),
    )
    if isinstance(route, Deny):
        if route.output:
            outcome.outputs.append(route.output)
    else:
        detail = (
            f"run seq {suspended.seq} reached its deadline with "
            f"{len(suspended.pending_intent_ids)} intents pending and its timeout route "
            "dropped it"
        )
        outcome.errors.append(
            error_record(
                key,
                ErrorReason.SUSPENSION_DROPPED,
                detail,
                now_ms,
                b"",
                suspended.seq,
                trace_id=suspended.trace_id,
            )
        )
    return outcome


def idle_expiry(last_activity_ms: int, ttl_ms: int | None) -> int | None:
    """When the key's idle state expires (event time, ms); ``None`` if it never does."""
    if ttl_ms is None or last_activity_ms == 0:
        return None
    return last_activity_ms + ttl_ms
