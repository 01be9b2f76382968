# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""The stateful ``DoFn`` behind ``RunAgent``: admission, activation, atomic commit, timers.

One element at a time per key (invariant 4). For each envelope the runtime either starts a new
run (an external event on a key that is not suspended), buffers it (an external event while the
key's run is suspended), or resumes the suspended run (a tool result or an approval that
matches a pending intent; anything else is an ``orphaned_result``).

An activation stages everything it does in its ``ActivationContext``. Only when the agent
returns a valid outcome is it committed, in one place (:meth:`AgentDoFn._commit`): memory and
cache cells (only if changed), the header (seq and last activity), the continuation, the
deadline timer, and the outputs. A failed or timed-out activation commits nothing and emits one
``ERROR`` trace and one ``.errors`` record carrying the original envelope (invariant 1).

Seq: a run takes the key's ``next_seq`` and advances it when it first commits (suspended or
complete); resumes keep the run's seq. External events that arrive while a run is suspended
wait in a bounded buffer and run, in arrival order and each with the next seq, as soon as the
suspended run ends (by completing, by its timeout route, or by idle-key cleanup).

Timers: ``deadline`` (processing time) fires a suspension's HITL timeout route; ``idle`` (event
time) clears a key's state ``ttl_ms`` after its last activity, keeping only its header so that
identifiers never repeat. The idle timer is armed once per idle period and re-armed when it
fires early, rather than reset on every element.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import apache_beam as beam
from apache_beam.coders import BytesCoder
from apache_beam.metrics.metric import Metrics
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec,
    ReadModifyWriteStateSpec,
    TimerSpec,
    on_timer,
)
from apache_beam.utils.timestamp import Timestamp

from beam_agents._json import canonical_json
from beam_agents._protos import (
    AgentEnvelope,
    AgentError,
    Approval,
    Continuation,
    KeyHeader,
    ToolIntent,
    ToolResult,
    TraceEvent,
)
from beam_agents.core.agent import (
    AgentFn,
    Complete,
    FallbackContext,
    Outcome,
    Suspend,
    intent_id_for,
)
from beam_agents.core.bridge import CoroutineDriver, enter_task
from beam_agents.core.context import (
    APPROVAL_TOOL_NAME,
    ActivationContext,
    ActivationServices,
    Resumption,
    StepRecord,
    intent_step_digest,
)
from beam_agents.core.errors import (
    ActivationTimeoutError,
    BudgetExceededError,
    ErrorReason,
    InvalidOutcomeError,
)
from beam_agents.core.model_gateway import METRICS_NAMESPACE, MODEL_COUNTERS, ModelGateway
from beam_agents.core.state import CONTINUATION_SCHEMA_VERSION, HEADER_SCHEMA_VERSION, KeyState
from beam_agents.core.tracing import TraceRecorder, trace_id_for
from beam_agents.hitl import Deny, Drop, Escalate, HitlPolicy, Route
from beam_agents.model.client import ProviderError
from beam_agents.model.resilience import CircuitBreakers
from beam_agents.tools import ToolRunner

if TYPE_CHECKING:
    from beam_agents.core.transform import AgentConfig

OUTPUT_TAG = "output"
INTENTS_TAG = "intents"
TRACES_TAG = "traces"
ERRORS_TAG = "errors"

DEADLINE_APPROVER = "beam-agents/deadline"
"""The ``approver`` recorded when a suspension's deadline answers a pending approval "no"."""

TRIGGER_EVENT = "event"
TRIGGER_TOOL_RESULT = "tool_result"
TRIGGER_APPROVAL = "approval"
TRIGGER_DEADLINE = "deadline"
TRIGGER_IDLE = "idle"


@dataclass(frozen=True, slots=True)
class CommitInfo:
    """Identifies a commit about to happen, for ``AgentConfig.before_commit``.

    ``trigger`` is what caused it: ``"event"``, ``"tool_result"``, ``"approval"`` (an
    activation), ``"deadline"`` or ``"idle"`` (a timer firing). ``first_step`` is the run's
    high-water step (the first position none of its activations had taken) when the activation
    or firing began, so ``(entity_key, seq, trigger, first_step)`` names one activation across
    bundle retries.
    """

    entity_key: bytes
    seq: int
    trigger: str
    first_step: int


def _no_committed_calls() -> None:
    """A new run's replay cache starts empty, without reading the cell (see ``state``)."""
    return None


def _error(
    entity_key: bytes,
    reason: ErrorReason,
    detail: str,
    event_time_ms: int,
    envelope: bytes,
    seq: int,
) -> TaggedOutput[str, AgentError]:
    return TaggedOutput(
        ERRORS_TAG,
        AgentError(
            entity_key=entity_key,
            reason=reason.value,
            detail=detail,
            event_time_ms=event_time_ms,
            envelope=envelope,
            seq=seq,
        ),
    )


def _steps_aligned(continuation: Continuation) -> bool:
    """Whether the run's step records cover every step it took, so more can be appended.

    Continuations written before steps were recorded have none; their runs never replay.
    """
    return len(continuation.steps) == continuation.next_step


def element_problem(element: Any) -> TaggedOutput[str, AgentError] | None:
    """The ``.errors`` record for a malformed input element, or ``None`` if it is well formed."""
    if not (isinstance(element, tuple) and len(element) == 2):
        return _error(
            b"",
            ErrorReason.MALFORMED_ELEMENT,
            f"expected a (bytes, AgentEnvelope) pair, got {type(element).__name__}",
            0,
            b"",
            0,
        )
    key, envelope = element
    if not isinstance(envelope, AgentEnvelope):
        return _error(
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
    return _error(
        key if isinstance(key, bytes) else b"",
        reason,
        detail,
        envelope.event_time_ms,
        envelope.SerializeToString(),
        0,
    )


def _ms(timestamp: Timestamp) -> int:
    return int(timestamp.micros // 1000)


def _timestamp(ms: int) -> Timestamp:
    return Timestamp(micros=ms * 1000)


_HEADER = ReadModifyWriteStateSpec("header", BytesCoder())
_MEMORY = ReadModifyWriteStateSpec("memory", BytesCoder())
_CACHE = ReadModifyWriteStateSpec("cache", BytesCoder())
_CONTINUATION = ReadModifyWriteStateSpec("continuation", BytesCoder())
_BUFFER = BagStateSpec("buffer", BytesCoder())
_DEADLINE = TimerSpec("deadline", TimeDomain.REAL_TIME)
_IDLE = TimerSpec("idle", TimeDomain.WATERMARK)

# DoFn parameter defaults, built once (Beam recognizes them by value). Typed Any because Beam
# substitutes the runtime state object, timer, key or timestamp for each of them.
_HEADER_STATE: Any = beam.DoFn.StateParam(_HEADER)
_MEMORY_STATE: Any = beam.DoFn.StateParam(_MEMORY)
_CACHE_STATE: Any = beam.DoFn.StateParam(_CACHE)
_CONTINUATION_STATE: Any = beam.DoFn.StateParam(_CONTINUATION)
_BUFFER_STATE: Any = beam.DoFn.StateParam(_BUFFER)
_DEADLINE_TIMER: Any = beam.DoFn.TimerParam(_DEADLINE)
_IDLE_TIMER: Any = beam.DoFn.TimerParam(_IDLE)
_KEY: Any = beam.DoFn.KeyParam
_TIMESTAMP: Any = beam.DoFn.TimestampParam


class _BeamModelCounters:
    """The model gateway's counters as Beam metrics (namespace ``beam_agents``).

    Counts add up here and reach Beam once per bundle (:meth:`flush`): every Beam counter update
    looks up the thread's metrics container, and a model call makes several.
    """

    __slots__ = ("_counters", "_pending")

    def __init__(self) -> None:
        self._counters = {name: Metrics.counter(METRICS_NAMESPACE, name) for name in MODEL_COUNTERS}
        self._pending = dict.fromkeys(MODEL_COUNTERS, 0)

    def inc(self, name: str, value: int = 1) -> None:
        """Add ``value`` to the counter ``name``."""
        self._pending[name] += value

    def flush(self) -> None:
        """Hand the counts since the last flush to Beam."""
        pending = self._pending
        for name, value in pending.items():
            if value:
                self._counters[name].inc(value)
                pending[name] = 0

    def discard(self) -> None:
        """Drop unflushed counts (a bundle that failed does not count)."""
        for name in self._pending:
            self._pending[name] = 0


async def _close_client(aclose: Callable[[], Awaitable[object]]) -> None:
    await enter_task()
    await aclose()


def _failure_reason(failure: BaseException) -> ErrorReason:
    if isinstance(failure, ActivationTimeoutError):
        return ErrorReason.ACTIVATION_TIMEOUT
    if isinstance(failure, BudgetExceededError):
        return ErrorReason.BUDGET_EXCEEDED
    if isinstance(failure, ProviderError):
        return ErrorReason.MODEL_ERROR
    return ErrorReason.ACTIVATION_ERROR


def _describe(failure: BaseException) -> str:
    notes = getattr(failure, "__notes__", None) or ()
    return "; ".join([f"{type(failure).__name__}: {failure}", *notes])


class _Call:
    """One ``process`` or timer call on one key: its state, its timers and its outputs."""

    __slots__ = ("deadline", "idle", "key", "out", "state")

    def __init__(self, key: bytes, state: KeyState, deadline: Any, idle: Any) -> None:
        self.key = key
        self.state = state
        self.deadline = deadline
        self.idle = idle
        self.out: list[Any] = []


class AgentDoFn(beam.DoFn):
    """Runs one agent over ``(key, AgentEnvelope)`` elements; see the module docstring."""

    def __init__(self, agent: AgentFn, config: AgentConfig) -> None:
        super().__init__()
        self._agent = agent
        self._config = config
        self._driver: CoroutineDriver | None = None
        self._services: ActivationServices | None = None
        self._counters: _BeamModelCounters | None = None

    # -- lifecycle -----------------------------------------------------------------------

    def setup(self) -> None:
        """Create the event loop, the model client and the circuit breakers this instance owns."""
        config = self._config
        driver = self._driver = CoroutineDriver()
        policy = config.hitl_policy
        factory = config.provider_factory
        model = None
        if factory is not None:
            threshold = config.circuit_failure_threshold
            self._counters = _BeamModelCounters()
            model = ModelGateway(
                factory(),
                retry_policy=config.model_retry,
                breakers=None
                if threshold is None
                else CircuitBreakers(threshold, config.circuit_reset_timeout_s),
                metrics=self._counters,
            )
        self._services = ActivationServices(
            model=model,
            tool_registry=config.tool_registry,
            tool_runner=ToolRunner(),
            intent_ttl_ms=config.intent_ttl_ms,
            approval_channel="" if policy is None else policy.approval_channel,
            approval_ttl_ms=config.intent_ttl_ms if policy is None else policy.intent_ttl_ms,
            cache_max_entries=config.model_cache_max_entries,
            cache_max_bytes=config.model_cache_max_bytes,
            max_tokens_per_run=config.max_tokens_per_run,
            time_left_s=driver.time_left_s,
        )

    def start_bundle(self) -> None:
        """Start counting the bundle's model calls afresh."""
        if self._counters is not None:
            self._counters.discard()

    def finish_bundle(self) -> None:
        """Report the bundle's model calls to Beam's metrics."""
        if self._counters is not None:
            self._counters.flush()

    def teardown(self) -> None:
        """Close the model client (if it can be closed) and the event loop."""
        driver, services = self._driver, self._services
        self._driver = self._services = None
        if driver is None:
            return
        client = None if services is None or services.model is None else services.model.client
        aclose = getattr(client, "aclose", None)
        try:
            if callable(aclose):
                driver.run(_close_client(aclose), self._config.activation_timeout_s)
        finally:
            driver.close()

    # -- elements ------------------------------------------------------------------------

    def process(
        self,
        element: tuple[bytes, AgentEnvelope],
        header: Any = _HEADER_STATE,
        memory: Any = _MEMORY_STATE,
        cache: Any = _CACHE_STATE,
        continuation: Any = _CONTINUATION_STATE,
        buffer: Any = _BUFFER_STATE,
        deadline: Any = _DEADLINE_TIMER,
        idle: Any = _IDLE_TIMER,
    ) -> list[Any]:
        """Admit one envelope and run, buffer or refuse it."""
        problem = element_problem(element)
        if problem is not None:
            return [problem]
        key, envelope = element
        call = _Call(key, KeyState(header, memory, cache, continuation, buffer), deadline, idle)
        payload = envelope.WhichOneof("payload")
        if payload == "external_event":
            if call.state.continuation is None:
                self._new_run(call, envelope, None)
            else:
                self._buffer_event(call, envelope)
        else:
            self._resume(call, envelope, payload == "approval")
        return call.out

    def _new_run(self, call: _Call, envelope: AgentEnvelope, envelope_bytes: bytes | None) -> None:
        state = call.state
        seq = state.header.next_seq
        now_ms = envelope.event_time_ms
        assert self._services is not None
        ctx = ActivationContext(
            entity_key=call.key,
            seq=seq,
            now_ms=now_ms,
            event=envelope.external_event,
            first_step=0,
            trace=TraceRecorder(call.key, seq, trace_id_for(call.key, seq), 0, now_ms),
            services=self._services,
            load_memory=state.read_memory,
            load_cache=_no_committed_calls,
        )
        outcome = self._activate(call, ctx, TRIGGER_EVENT, envelope, envelope_bytes)
        if outcome is not None:
            self._commit(call, ctx, outcome, TRIGGER_EVENT, None)

    def _buffer_event(self, call: _Call, envelope: AgentEnvelope) -> None:
        state = call.state
        suspended = state.continuation
        assert suspended is not None
        if len(state.buffered()) >= self._config.max_buffered_events:
            call.out.append(
                _error(
                    call.key,
                    ErrorReason.BUFFER_OVERFLOW,
                    f"{self._config.max_buffered_events} external events are already waiting "
                    f"for suspended run seq {suspended.seq} of this key; raise "
                    "AgentConfig.max_buffered_events or resume the run sooner",
                    envelope.event_time_ms,
                    envelope.SerializeToString(),
                    suspended.seq,
                )
            )
            return
        state.buffer(envelope.SerializeToString())
        self._touch(call, envelope.event_time_ms)

    def _resume(self, call: _Call, envelope: AgentEnvelope, is_approval: bool) -> None:
        state = call.state
        suspended = state.continuation
        answer: ToolResult | Approval = envelope.approval if is_approval else envelope.tool_result
        refusal = self._admission_refusal(call.key, suspended, answer, is_approval)
        if refusal is not None:
            call.out.append(
                _error(
                    call.key,
                    ErrorReason.ORPHANED_RESULT,
                    refusal,
                    envelope.event_time_ms,
                    envelope.SerializeToString(),
                    state.header.next_seq if suspended is None else suspended.seq,
                )
            )
            return
        assert suspended is not None and self._services is not None
        admitted = Continuation()
        admitted.CopyFrom(suspended)
        position = list(admitted.pending_intent_ids).index(answer.intent_id)
        del admitted.pending_intent_ids[position]
        del admitted.pending_kinds[position]
        admitted.answered_intent_ids.append(answer.intent_id)
        if isinstance(answer, Approval):
            admitted.approvals.append(answer)
        else:
            admitted.results.append(answer)
        now_ms = envelope.event_time_ms
        ctx = ActivationContext(
            entity_key=call.key,
            seq=admitted.seq,
            now_ms=now_ms,
            event=b"",
            first_step=admitted.next_step,
            trace=TraceRecorder(
                call.key, admitted.seq, admitted.trace_id, admitted.trace_sequence, now_ms
            ),
            services=self._services,
            load_memory=state.read_memory,
            load_cache=state.read_cache,
            resumption=Resumption(
                result=None if isinstance(answer, Approval) else answer,
                approval=answer if isinstance(answer, Approval) else None,
                snapshot=admitted.snapshot,
                results={result.intent_id: result for result in admitted.results},
                pending=tuple(
                    zip(admitted.pending_intent_ids, admitted.pending_kinds, strict=True)
                ),
                tokens_used=admitted.tokens_used,
                steps=admitted.steps,
            ),
        )
        trigger = TRIGGER_APPROVAL if is_approval else TRIGGER_TOOL_RESULT
        outcome = self._activate(call, ctx, trigger, envelope, None)
        if outcome is not None:
            self._commit(call, ctx, outcome, trigger, admitted)

    def _admission_refusal(
        self,
        key: bytes,
        suspended: Continuation | None,
        answer: ToolResult | Approval,
        is_approval: bool,
    ) -> str | None:
        """Why ``answer`` cannot resume this key's run, or ``None`` if it is admitted."""
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
            timed_out = any(
                approval.intent_id == intent_id and approval.approver == DEADLINE_APPROVER
                for approval in suspended.approvals
            )
            if timed_out:
                return (
                    f"the {what} for intent {intent_id!r} arrived after the deadline: the "
                    "request timed out and was escalated"
                )
            return f"duplicate delivery: the {what} for intent {intent_id!r} was already applied"
        if intent_id not in suspended.pending_intent_ids:
            return (
                f"intent {intent_id!r} is not pending in this key's suspended run "
                f"(seq {suspended.seq})"
            )
        kind = suspended.pending_kinds[list(suspended.pending_intent_ids).index(intent_id)]
        # An approval intent may also end with a ToolResult (the effector reports it EXPIRED or
        # REJECTED), but a tool intent is never answered by an approval.
        if is_approval and kind != ToolIntent.APPROVAL:
            return f"intent {intent_id!r} is a tool intent and cannot take an approval"
        if suspended.deadline_ms and self._processing_ms() >= suspended.deadline_ms:
            return (
                f"the {what} for intent {intent_id!r} arrived after the deadline "
                f"({suspended.deadline_ms} ms); the timeout route decides this run"
            )
        return None

    # -- activation and commit -----------------------------------------------------------

    def _activate(
        self,
        call: _Call,
        ctx: ActivationContext,
        trigger: str,
        envelope: AgentEnvelope,
        envelope_bytes: bytes | None,
    ) -> Outcome | None:
        """Run the agent; on failure emit the error and trace and return ``None``."""
        ctx.trace.record(TraceEvent.ACTIVATION_START, ctx.high_water_step, {"trigger": trigger})
        assert self._driver is not None
        failure: BaseException
        try:
            outcome = self._driver.run(self._agent(ctx), self._config.activation_timeout_s)
            return self._checked(outcome, ctx)
        except (Exception, asyncio.CancelledError) as exc:
            failure = exc
        reason = _failure_reason(failure)
        call.out.append(
            TaggedOutput(
                TRACES_TAG,
                ctx.trace.failure(
                    ctx.high_water_step, {"reason": reason.value, "error": type(failure).__name__}
                ),
            )
        )
        call.out.append(
            _error(
                call.key,
                reason,
                _describe(failure),
                envelope.event_time_ms,
                envelope.SerializeToString() if envelope_bytes is None else envelope_bytes,
                ctx.seq,
            )
        )
        return None

    def _checked(self, outcome: object, ctx: ActivationContext) -> Outcome:
        if ctx.budget_error is not None:
            # The agent caught it, but a run past its budget must not commit.
            raise ctx.budget_error
        if isinstance(outcome, Complete):
            if not isinstance(outcome.output, bytes):
                raise InvalidOutcomeError(
                    f"Complete.output must be bytes, got {type(outcome.output).__name__}"
                )
            return outcome
        if isinstance(outcome, Suspend):
            if not ctx.pending_after() and self._suspension_timeout(outcome) is None:
                raise InvalidOutcomeError(
                    "the agent suspended with no pending intents and no timeout, so nothing "
                    "could ever resume it; stage an intent first, set Suspend(timeout_ms=...), "
                    "or return Complete"
                )
            return outcome
        raise InvalidOutcomeError(
            f"an agent must return Complete or Suspend, got {type(outcome).__name__}"
        )

    def _suspension_timeout(self, outcome: Suspend) -> int | None:
        if outcome.timeout_ms is not None:
            return outcome.timeout_ms
        policy = self._config.hitl_policy
        return None if policy is None else policy.timeout_ms

    def _processing_ms(self) -> int:
        return int(self._config.processing_clock() * 1000)

    def _commit(
        self,
        call: _Call,
        ctx: ActivationContext,
        outcome: Outcome,
        trigger: str,
        base: Continuation | None,
    ) -> None:
        """Apply a successful activation: state, timers and outputs, all at once.

        ``base`` is the run's continuation with the admitted answer applied (for a resume), or
        ``None`` for a new run (whose continuation is built only if it suspends).
        """
        state = call.state
        was_suspended = state.continuation is not None
        suspended: Continuation | None = None
        if isinstance(outcome, Suspend):
            if base is None:
                base = Continuation(started_at_ms=ctx.now_ms)
            suspended = self._suspension(ctx, outcome, base)
        else:
            ctx.trace.record(
                TraceEvent.ACTIVATION_END,
                ctx.high_water_step,
                {"output_bytes": str(len(outcome.output))},
            )
        self._before_commit(call.key, ctx.seq, trigger, 0 if base is None else base.next_step)
        memory = ctx.touched_memory
        if memory is not None and memory.changed:
            state.write_memory(memory.encode())
        header = state.header
        self._write_header(call, max(header.next_seq, ctx.seq + 1), ctx.now_ms)
        if suspended is not None:
            cache = ctx.touched_cache
            if cache is not None and cache.changed:
                state.write_cache(cache.encode())
            state.write_continuation(suspended)
            self._set_deadline(call, suspended.deadline_ms)
        elif was_suspended:
            state.end_run()
            call.deadline.clear()
        out = call.out
        if ctx.intents:
            out.extend([TaggedOutput(INTENTS_TAG, intent) for intent in ctx.intents])
        out.extend([TaggedOutput(TRACES_TAG, event) for event in ctx.trace.events])
        if isinstance(outcome, Complete):
            if outcome.output:
                out.append(outcome.output)
            if was_suspended:
                self._drain(call)

    def _suspension(
        self, ctx: ActivationContext, outcome: Suspend, base: Continuation
    ) -> Continuation:
        """The continuation a ``Suspend`` persists (and its ``SUSPENDED`` trace)."""
        pending = ctx.pending_after()
        timeout = self._suspension_timeout(outcome)
        next_step = ctx.high_water_step
        ctx.trace.record(TraceEvent.SUSPENDED, next_step, {"pending": str(len(pending))})
        suspended = Continuation()
        suspended.CopyFrom(base)
        suspended.schema_version = CONTINUATION_SCHEMA_VERSION
        suspended.seq = ctx.seq
        suspended.next_step = next_step
        if _steps_aligned(base):
            suspended.steps.extend(
                StepRecord(kind=kind, digest=digest)  # type: ignore[arg-type]
                for kind, digest in ctx.new_steps
            )
        else:
            del suspended.steps[:]
        suspended.snapshot = outcome.snapshot
        suspended.adapter = outcome.adapter
        del suspended.pending_intent_ids[:]
        del suspended.pending_kinds[:]
        suspended.pending_intent_ids.extend(intent_id for intent_id, _ in pending)
        suspended.pending_kinds.extend(kind for _, kind in pending)  # type: ignore[misc]
        suspended.deadline_ms = 0 if timeout is None else self._processing_ms() + timeout
        suspended.trace_id = ctx.trace.trace_id
        suspended.tokens_used = base.tokens_used + ctx.tokens_used
        suspended.trace_sequence = ctx.trace.next_sequence
        return suspended

    def _before_commit(self, key: bytes, seq: int, trigger: str, first_step: int) -> None:
        hook = self._config.before_commit
        if hook is not None:
            hook(CommitInfo(entity_key=key, seq=seq, trigger=trigger, first_step=first_step))

    def _write_header(self, call: _Call, next_seq: int, activity_ms: int) -> None:
        """Store the header; arm the idle timer if this key has none armed."""
        previous = call.state.header
        last_activity_ms = max(previous.last_activity_ms, activity_ms)
        call.state.write_header(
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
            call.idle.set(_timestamp(last_activity_ms + ttl_ms))

    def _touch(self, call: _Call, activity_ms: int) -> None:
        self._write_header(call, call.state.header.next_seq, activity_ms)

    def _set_deadline(self, call: _Call, deadline_ms: int) -> None:
        if deadline_ms:
            call.deadline.set(_timestamp(deadline_ms))
        else:
            call.deadline.clear()

    def _drain(self, call: _Call) -> None:
        """Run the events buffered during a suspension that just ended, until one suspends."""
        waiting = call.state.buffered()
        if not waiting:
            return
        while waiting and call.state.continuation is None:
            envelope_bytes = waiting.pop(0)
            self._new_run(call, AgentEnvelope.FromString(envelope_bytes), envelope_bytes)
        call.state.replace_buffer(waiting)

    # -- timers --------------------------------------------------------------------------

    @on_timer(_DEADLINE)
    def _on_deadline(
        self,
        key: bytes = _KEY,
        fired: Timestamp = _TIMESTAMP,
        header: Any = _HEADER_STATE,
        memory: Any = _MEMORY_STATE,
        cache: Any = _CACHE_STATE,
        continuation: Any = _CONTINUATION_STATE,
        buffer: Any = _BUFFER_STATE,
        deadline: Any = _DEADLINE_TIMER,
        idle: Any = _IDLE_TIMER,
    ) -> list[Any]:
        """A suspension reached its deadline: take the HITL timeout route."""
        call = _Call(key, KeyState(header, memory, cache, continuation, buffer), deadline, idle)
        suspended = call.state.continuation
        fired_ms = _ms(fired)
        if suspended is None or suspended.deadline_ms != fired_ms:
            return []  # a timer left over from a suspension that has since moved on
        now_ms = call.state.header.last_activity_ms
        trace = TraceRecorder(
            key, suspended.seq, suspended.trace_id, suspended.trace_sequence, now_ms
        )
        trace.record(
            TraceEvent.ACTIVATION_START, suspended.next_step, {"trigger": TRIGGER_DEADLINE}
        )
        fallback = FallbackContext(
            entity_key=key,
            seq=suspended.seq,
            snapshot=suspended.snapshot,
            deadline_ms=suspended.deadline_ms,
            fired_at_ms=fired_ms,
            pending_intent_ids=frozenset(suspended.pending_intent_ids),
        )
        policy = self._config.hitl_policy
        route: Route | None = None
        try:
            route = Drop() if policy is None else policy.decide(fallback, suspended.escalations)
        except Exception as exc:
            route_failure: Exception | None = exc
        else:
            route_failure = None
        self._before_commit(key, suspended.seq, TRIGGER_DEADLINE, suspended.next_step)
        if route is None:
            assert route_failure is not None
            failure = f"{type(route_failure).__name__}: {route_failure}"
            attributes = {"reason": ErrorReason.TIMEOUT_ROUTE_ERROR.value, "error": failure}
            call.out.append(
                TaggedOutput(TRACES_TAG, trace.failure(suspended.next_step, attributes))
            )
            call.out.append(
                _error(
                    key,
                    ErrorReason.TIMEOUT_ROUTE_ERROR,
                    f"the on_timeout route failed ({failure}); the run was ended without a "
                    "decision (fail closed)",
                    now_ms,
                    b"",
                    suspended.seq,
                )
            )
            self._end_suspension(call)
            return call.out
        if isinstance(route, Escalate):
            assert policy is not None
            self._escalate(call, suspended, trace, fired_ms, now_ms, policy)
            return call.out
        trace.record(
            TraceEvent.ACTIVATION_END,
            suspended.next_step,
            {"route": "deny" if isinstance(route, Deny) else "drop"},
        )
        call.out.extend(TaggedOutput(TRACES_TAG, event) for event in trace.events)
        if isinstance(route, Deny):
            if route.output:
                call.out.append(route.output)
        else:
            call.out.append(
                _error(
                    key,
                    ErrorReason.SUSPENSION_DROPPED,
                    f"run seq {suspended.seq} reached its deadline with "
                    f"{len(suspended.pending_intent_ids)} intents pending and its timeout route "
                    "dropped it",
                    now_ms,
                    b"",
                    suspended.seq,
                )
            )
        self._end_suspension(call)
        return call.out

    def _escalate(
        self,
        call: _Call,
        suspended: Continuation,
        trace: TraceRecorder,
        fired_ms: int,
        now_ms: int,
        policy: HitlPolicy,
    ) -> None:
        """Answer pending approvals "no" (by the deadline), ask again, and re-suspend."""
        escalated = Continuation()
        escalated.CopyFrom(suspended)
        superseded: list[str] = []
        kept: list[tuple[str, int]] = []
        for intent_id, kind in zip(
            suspended.pending_intent_ids, suspended.pending_kinds, strict=True
        ):
            if kind == ToolIntent.APPROVAL:
                superseded.append(intent_id)
                escalated.answered_intent_ids.append(intent_id)
                escalated.approvals.append(
                    Approval(
                        intent_id=intent_id,
                        approved=False,
                        approver=DEADLINE_APPROVER,
                        decided_at_ms=fired_ms,
                        reason="no decision before the deadline; escalated",
                    )
                )
            else:
                kept.append((intent_id, kind))
        step = suspended.next_step
        intent_id = intent_id_for(call.key, suspended.seq, step)
        args_json = canonical_json(
            {
                "escalation": suspended.escalations + 1,
                "supersedes": superseded,
                "pending_intent_ids": [pending_id for pending_id, _ in kept],
            }
        )
        intent = ToolIntent(
            intent_id=intent_id,
            entity_key=call.key,
            seq=suspended.seq,
            step_index=step,
            tool_name=APPROVAL_TOOL_NAME,
            args_json=args_json,
            created_at_ms=now_ms,
            expires_at_ms=now_ms + policy.intent_ttl_ms,
            kind=ToolIntent.APPROVAL,
            trace_id=suspended.trace_id,
            channel=policy.approval_channel,
        )
        trace.record(
            TraceEvent.INTENT_EMITTED,
            step,
            {"intent_id": intent_id, "tool_name": APPROVAL_TOOL_NAME, "kind": "APPROVAL"},
        )
        if _steps_aligned(escalated):
            escalated.steps.append(
                StepRecord(
                    kind=StepRecord.APPROVAL,
                    digest=intent_step_digest(ToolIntent.APPROVAL, APPROVAL_TOOL_NAME, args_json),
                )
            )
        kept.append((intent_id, ToolIntent.APPROVAL))
        trace.record(
            TraceEvent.SUSPENDED, step + 1, {"pending": str(len(kept)), "route": "escalate"}
        )
        del escalated.pending_intent_ids[:]
        del escalated.pending_kinds[:]
        escalated.pending_intent_ids.extend(pending_id for pending_id, _ in kept)
        escalated.pending_kinds.extend(kind for _, kind in kept)  # type: ignore[misc]
        escalated.next_step = step + 1
        escalated.escalations = suspended.escalations + 1
        escalated.deadline_ms = fired_ms + policy.timeout_ms
        escalated.trace_sequence = trace.next_sequence
        call.state.write_continuation(escalated)
        self._set_deadline(call, escalated.deadline_ms)
        call.out.append(TaggedOutput(INTENTS_TAG, intent))
        call.out.extend(TaggedOutput(TRACES_TAG, event) for event in trace.events)

    def _end_suspension(self, call: _Call) -> None:
        call.state.end_run()
        call.deadline.clear()
        self._drain(call)

    @on_timer(_IDLE)
    def _on_idle(
        self,
        key: bytes = _KEY,
        fired: Timestamp = _TIMESTAMP,
        header: Any = _HEADER_STATE,
        memory: Any = _MEMORY_STATE,
        cache: Any = _CACHE_STATE,
        continuation: Any = _CONTINUATION_STATE,
        buffer: Any = _BUFFER_STATE,
        deadline: Any = _DEADLINE_TIMER,
        idle: Any = _IDLE_TIMER,
    ) -> list[Any]:
        """Clear an idle key's state, keeping its header so identifiers never repeat."""
        ttl_ms = self._config.ttl_ms
        call = _Call(key, KeyState(header, memory, cache, continuation, buffer), deadline, idle)
        current = call.state.header
        if ttl_ms is None or current.last_activity_ms == 0:
            return []
        expires_ms = current.last_activity_ms + ttl_ms
        if expires_ms > _ms(fired):
            idle.set(_timestamp(expires_ms))
            return []
        wiped = call.state.continuation
        self._before_commit(key, current.next_seq, TRIGGER_IDLE, current.next_seq)
        call.state.wipe()
        call.state.write_header(
            KeyHeader(schema_version=HEADER_SCHEMA_VERSION, next_seq=current.next_seq)
        )
        if wiped is not None:
            deadline.clear()
            call.out.append(
                _error(
                    key,
                    ErrorReason.SUSPENSION_WIPED,
                    f"run seq {wiped.seq} was still suspended, waiting for "
                    f"{len(wiped.pending_intent_ids)} intents, when the key's state was cleaned "
                    f"up after {ttl_ms} ms without activity",
                    current.last_activity_ms,
                    b"",
                    wiped.seq,
                )
            )
            self._drain(call)
        return call.out
