"""The activation core: what one envelope or timer firing does to one key, without Beam.

:class:`Activator` takes the key's lazily loaded :class:`KeyState` and returns a :class:`Plan`:
a new run, a buffered event, a resume or a refusal for an envelope; the timeout route for a
deadline; cleanup for an idle key. A run commits only if its agent returns a valid outcome.
The order of these decisions is mapped in ``core/README.md``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from beam_agents._protos import (
    AgentEnvelope,
    Approval,
    Continuation,
    KeyHeader,
    ToolResult,
    TraceEvent,
)
from beam_agents.core import clocks
from beam_agents.core.admission import answer_refusal
from beam_agents.core.agent import AgentFn, Complete, Outcome, Suspend
from beam_agents.core.approvals import stale_approval
from beam_agents.core.config import (
    TRIGGER_APPROVAL,
    TRIGGER_DEADLINE,
    TRIGGER_EVENT,
    TRIGGER_IDLE,
    TRIGGER_TOOL_RESULT,
    AgentConfig,
    CommitInfo,
)
from beam_agents.core.context import ActivationContext, ActivationServices, staged
from beam_agents.core.continuation import admit, resumption, suspend
from beam_agents.core.errors import (
    ActivationTimeoutError,
    BudgetExceededError,
    ErrorReason,
    InvalidOutcomeError,
)
from beam_agents.core.failures import explain
from beam_agents.core.plan import Plan, error_record
from beam_agents.core.recording import ActivationRecorder, record_options
from beam_agents.core.routes import choose_route, deadline_outcome, idle_expiry, wiped_error
from beam_agents.core.staging import Staged
from beam_agents.core.state import HEADER_SCHEMA_VERSION, KeyState
from beam_agents.core.tracing import TraceRecorder, trace_id_for
from beam_agents.model.client import ProviderError

RunCoroutine = Callable[[Coroutine[Any, Any, Any], float], Any]
"""Drives an agent's coroutine to its end within a timeout (``CoroutineDriver.run``)."""


def _no_committed_calls() -> None:
    """A new run's replay cache starts empty, without reading the cell (see ``state``)."""
    return None


class Activator:
    """Decides, for one agent and config, what each element and timer does to a key.

    ``ticks``: the deadline timer is a tick at which the run's current deadline is checked (on
    the ``FnApiRunner``, see ``core/README.md``), not a timer set for that deadline.
    """

    def __init__(
        self,
        agent: AgentFn,
        config: AgentConfig,
        services: ActivationServices,
        run: RunCoroutine,
        *,
        ticks: bool = False,
    ) -> None:
        self._agent = agent
        self._ticks = ticks
        self._config = config
        self._services = services
        self._run = run
        self._clock = clocks.resolved(config.processing_clock)
        self._clock_readable = clocks.is_readable(config.processing_clock)
        self._record = record_options(config.record)

    # -- elements ------------------------------------------------------------------------

    def on_element(self, key: bytes, envelope: AgentEnvelope, state: KeyState) -> Plan:
        """Start, buffer or resume a run for a well-formed envelope, or refuse it."""
        plan = Plan(state)
        payload = envelope.WhichOneof("payload")
        if payload == "external_event":
            if state.continuation is None:
                self._new_run(plan, key, envelope, None)
            else:
                self._buffer_event(plan, key, envelope)
        else:
            self._resume_with(plan, key, envelope)
        return plan

    def _new_run(
        self, plan: Plan, key: bytes, envelope: AgentEnvelope, envelope_bytes: bytes | None
    ) -> None:
        state = plan.state
        seq = state.header.next_seq
        now_ms = envelope.event_time_ms
        ctx = ActivationContext(
            entity_key=key,
            seq=seq,
            now_ms=now_ms,
            event=envelope.external_event,
            first_step=0,
            trace=TraceRecorder(key, seq, trace_id_for(key, seq), 0, now_ms),
            services=self._services,
            load_memory=state.read_memory,
            load_cache=_no_committed_calls,
        )
        record = staged(ctx)
        outcome = self._activate(plan, ctx, record, TRIGGER_EVENT, envelope, envelope_bytes)
        if outcome is not None:
            self._commit(plan, ctx, record, outcome, TRIGGER_EVENT, None)

    def _buffer_event(self, plan: Plan, key: bytes, envelope: AgentEnvelope) -> None:
        state = plan.state
        suspended = state.continuation
        assert suspended is not None
        limit = self._config.max_buffered_events
        if len(state.buffered()) >= limit:
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
                )
            )
            return
        state.buffer(envelope.SerializeToString())
        self._write_header(plan, state.header.next_seq, envelope.event_time_ms)

    def _resume_with(self, plan: Plan, key: bytes, envelope: AgentEnvelope) -> None:
        """Resume the run with the envelope's approval or tool result, or refuse it."""
        answer: ToolResult | Approval
        if envelope.HasField("approval"):
            answer, trigger = envelope.approval, TRIGGER_APPROVAL
        else:
            answer, trigger = envelope.tool_result, TRIGGER_TOOL_RESULT
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
                )
            )
            return
        assert suspended is not None
        admitted = admit(suspended, answer)
        now_ms = envelope.event_time_ms
        ctx = ActivationContext(
            entity_key=key,
            seq=admitted.seq,
            now_ms=now_ms,
            event=b"",
            first_step=admitted.next_step,
            trace=TraceRecorder(
                key, admitted.seq, admitted.trace_id, admitted.trace_sequence, now_ms
            ),
            services=self._services,
            load_memory=state.read_memory,
            load_cache=state.read_cache,
            resumption=resumption(admitted, answer),
        )
        record = staged(ctx)
        outcome = self._activate(plan, ctx, record, trigger, envelope, None)
        if outcome is not None:
            self._commit(plan, ctx, record, outcome, trigger, admitted)

    # -- activation and commit -----------------------------------------------------------

    def _activate(
        self,
        plan: Plan,
        ctx: ActivationContext,
        record: Staged,
        trigger: str,
        envelope: AgentEnvelope,
        envelope_bytes: bytes | None,
    ) -> Outcome | None:
        """Run the agent; on failure plan the error and its trace and return ``None``."""
        trace = record.trace
        if self._record is not None:
            record.recording = ActivationRecorder(
                self._record, envelope, trigger, ctx.high_water_step
            )
        trace.record(TraceEvent.ACTIVATION_START, ctx.high_water_step, {"trigger": trigger})
        failure: BaseException
        try:
            outcome = self._run(self._agent(ctx), self._config.activation_timeout_s)
            return self._checked(outcome, record)
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
            )
        )
        return None

    def _checked(self, outcome: object, record: Staged) -> Outcome:
        if record.budget_error is not None:
            # The agent caught it, but a run past its budget must not commit.
            raise record.budget_error
        if isinstance(outcome, Complete):
            if not isinstance(outcome.output, bytes):
                raise InvalidOutcomeError(
                    f"Complete.output must be bytes, got {type(outcome.output).__name__}"
                )
            return outcome
        if isinstance(outcome, Suspend):
            if not record.pending_after() and self._suspension_timeout(outcome) is None:
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
        record: Staged,
        outcome: Outcome,
        trigger: str,
        base: Continuation | None,
    ) -> None:
        """Plan a successful activation's state, timers and outputs, all at once.

        ``base`` is the run's continuation with the admitted answer applied (for a resume), or
        ``None`` for a new run (whose continuation is built only if it suspends).
        """
        state = plan.state
        if record.recording is not None:  # first: it reads the state this commit replaces
            recorded = record.recording.finish(ctx.entity_key, ctx.seq, record, outcome, state)
            plan.records = (*plan.records, recorded)
        was_suspended = state.continuation is not None
        suspended: Continuation | None = None
        if isinstance(outcome, Suspend):
            timeout = self._suspension_timeout(outcome)
            suspended = suspend(
                base,
                record,
                seq=ctx.seq,
                started_at_ms=ctx.now_ms,
                snapshot=outcome.snapshot,
                adapter=outcome.adapter,
                deadline_ms=0 if timeout is None else self.processing_ms() + timeout,
            )
        else:
            record.trace.record(
                TraceEvent.ACTIVATION_END,
                record.cursor.high_water_step,
                record.closing_attributes({"output_bytes": str(len(outcome.output))}),
            )
        if self._config.before_commit is not None:
            first_step = 0 if base is None else base.next_step
            self._before_commit(ctx.entity_key, ctx.seq, trigger, first_step)
        memory = record.memory
        if memory is not None and memory.changed:
            state.write_memory(memory.encode())
        self._write_header(plan, max(state.header.next_seq, ctx.seq + 1), ctx.now_ms)
        if suspended is not None:
            cache = record.cache
            if cache is not None and cache.changed:
                suspended.replay_cache = cache.encode()
            state.write_continuation(suspended)
            plan.deadline_ms = suspended.deadline_ms
        elif was_suspended:
            state.end_run()
            plan.deadline_ms = 0
        if record.intents:
            plan.intents.extend(record.intents)
        plan.traces.extend(record.trace.events)
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

    def processing_ms(self) -> int:
        """Now, in milliseconds, on the clock deadlines are placed on."""
        return int(self._clock() * 1000)

    def _before_commit(self, key: bytes, seq: int, trigger: str, first_step: int) -> None:
        hook = self._config.before_commit
        if hook is not None:
            hook(CommitInfo(entity_key=key, seq=seq, trigger=trigger, first_step=first_step))

    def _write_header(self, plan: Plan, next_seq: int, activity_ms: int) -> None:
        """Store the header; arm the idle timer if this key has none armed."""
        state = plan.state
        previous = state.header
        last_activity_ms = max(previous.last_activity_ms, activity_ms)
        state.write_header(
            KeyHeader(
                schema_version=HEADER_SCHEMA_VERSION,
                next_seq=next_seq,
                last_activity_ms=last_activity_ms,
            )
        )
        ttl_ms = self._config.ttl_ms
        # A zero last activity means no idle timer is armed (a fresh or cleaned-up key); an
        # armed timer that fires early re-arms itself, so it need not move on every element.
        if ttl_ms is not None and previous.last_activity_ms == 0:
            plan.idle_ms = last_activity_ms + ttl_ms

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

    def _end_suspension(self, plan: Plan, key: bytes) -> None:
        plan.state.end_run()
        plan.deadline_ms = 0
        self._drain(plan, key)

    # -- timers --------------------------------------------------------------------------

    def on_deadline(self, key: bytes, fired_ms: int, state: KeyState) -> Plan:
        """A suspension reached its deadline: take the HITL timeout route."""
        plan = Plan(state)
        suspended = state.continuation
        if suspended is None or not suspended.deadline_ms:
            return plan  # a timer left over from a run that has since ended
        if self._ticks:
            fired_ms = suspended.deadline_ms  # a tick: check the deadline the run has now
        elif suspended.deadline_ms != fired_ms:
            return plan  # a timer left over from a suspension that has since moved on
        if self._clock_readable and self.processing_ms() < fired_ms:
            plan.deadline_ms = fired_ms  # fired early (a local runner's bundle ended): re-arm
            plan.early = True
            return plan
        policy = self._config.hitl_policy
        route = choose_route(policy, key, suspended, fired_ms)
        self._before_commit(key, suspended.seq, TRIGGER_DEADLINE, suspended.next_step)
        now_ms = state.header.last_activity_ms
        taken = deadline_outcome(route, key, suspended, policy, fired_ms=fired_ms, now_ms=now_ms)
        plan.traces.extend(taken.traces)
        plan.outputs.extend(taken.outputs)
        plan.errors.extend(taken.errors)
        plan.intents.extend(taken.compensations)
        if taken.escalated is None:
            self._end_suspension(plan, key)
        else:
            assert taken.intent is not None
            state.write_continuation(taken.escalated)
            plan.deadline_ms = taken.escalated.deadline_ms
            plan.intents.append(taken.intent)
        return plan

    def on_idle(self, key: bytes, fired_ms: int, state: KeyState) -> Plan:
        """Clear an idle key's state, keeping its header so identifiers never repeat."""
        plan = Plan(state)
        ttl_ms = self._config.ttl_ms
        current = state.header
        expires_ms = idle_expiry(current, ttl_ms)
        if expires_ms is None or ttl_ms is None:  # (ttl_ms for the type checker)
            return plan
        if expires_ms > fired_ms:
            plan.idle_ms = expires_ms
            return plan
        wiped = state.continuation
        self._before_commit(key, current.next_seq, TRIGGER_IDLE, current.next_seq)
        state.wipe()
        state.write_header(
            KeyHeader(schema_version=HEADER_SCHEMA_VERSION, next_seq=current.next_seq)
        )
        if wiped is not None:
            plan.deadline_ms = 0
            plan.errors.append(wiped_error(key, wiped, ttl_ms, current.last_activity_ms))
            self._drain(plan, key)
        return plan


def _failure_reason(failure: BaseException) -> ErrorReason:
    if isinstance(failure, ActivationTimeoutError):
        return ErrorReason.ACTIVATION_TIMEOUT
    if isinstance(failure, BudgetExceededError):
        return ErrorReason.BUDGET_EXCEEDED
    if isinstance(failure, ProviderError):
        return ErrorReason.MODEL_ERROR
    return ErrorReason.ACTIVATION_ERROR
