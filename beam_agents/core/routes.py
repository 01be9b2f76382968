"""Timer decisions as pure functions: a suspension's deadline route and idle-key cleanup.

:func:`deadline_outcome` turns the ``HitlPolicy`` route chosen for a timed-out suspension into
what the run does (deny, drop, escalate, or fail closed when the route itself failed);
:func:`idle_expiry` says when an idle key's state is due for cleanup. Neither reads a clock:
both are given the timer's firing time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from beam_agents._protos import AgentError, Continuation, KeyHeader, ToolIntent, TraceEvent
from beam_agents.core.compensation import stage_route_compensations
from beam_agents.core.config import TRIGGER_DEADLINE
from beam_agents.core.continuation import escalate
from beam_agents.core.errors import ErrorReason
from beam_agents.core.failures import explain
from beam_agents.core.plan import error_record
from beam_agents.core.tracing import TraceRecorder
from beam_agents.hitl import Deny, Drop, Escalate, FallbackContext, HitlPolicy, Route


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


@dataclass(frozen=True, slots=True)
class RouteFailure:
    """The timeout route raised instead of deciding: the run ends without a decision."""

    error: Exception


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
) -> DeadlineOutcome:
    """Apply ``route`` to the timed-out run ``suspended`` (``now_ms``: the key's last activity)."""
    step = suspended.next_step
    trace = TraceRecorder(key, suspended.seq, suspended.trace_id, suspended.trace_sequence, now_ms)
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
        )
        return DeadlineOutcome(traces=[trace.failure(step, attributes)], errors=[error])
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
        return DeadlineOutcome(traces=trace.events, escalated=escalated, intent=intent)
    denied = isinstance(route, Deny)
    compensations = []
    if isinstance(route, Deny) and route.compensate:
        compensations = stage_route_compensations(suspended, trace)
        step += len(compensations)
    trace.record(TraceEvent.ACTIVATION_END, step, {"route": "deny" if denied else "drop"})
    outcome = DeadlineOutcome(traces=trace.events, compensations=compensations)
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
            _run_error(key, suspended, ErrorReason.SUSPENSION_DROPPED, detail, now_ms)
        )
    return outcome


def idle_expiry(header: KeyHeader, ttl_ms: int | None) -> int | None:
    """When the key's idle state expires (event time, ms); ``None`` if it never does."""
    if ttl_ms is None or header.last_activity_ms == 0:
        return None
    return header.last_activity_ms + ttl_ms


def wiped_error(key: bytes, wiped: Continuation, ttl_ms: int, last_activity_ms: int) -> AgentError:
    """The ``.errors`` record of a suspended run that idle-key cleanup ended."""
    detail = (
        f"run seq {wiped.seq} was still suspended, waiting for "
        f"{len(wiped.pending_intent_ids)} intents, when the key's state was cleaned up after "
        f"{ttl_ms} ms without activity"
    )
    return _run_error(key, wiped, ErrorReason.SUSPENSION_WIPED, detail, last_activity_ms)


def _run_error(
    key: bytes, run: Continuation, reason: ErrorReason, detail: str, at_ms: int
) -> AgentError:
    return error_record(key, reason, detail, at_ms, b"", run.seq)
