"""The one owner of every change to a suspended run's ``Continuation``.

Admitting an answer, building the :class:`Resumption` an activation resumes from, suspending
and escalating all return a new ``Continuation`` (the committed one is never edited in place),
so a failed activation leaves the key's state as it was. The parallel ``pending_intent_ids`` and
``pending_kinds`` lists and the step records are edited only here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from beam_agents._protos import (
    Approval,
    CompensationLink,
    Continuation,
    ToolIntent,
    ToolResult,
    TraceEvent,
    canonical_json,
)
from beam_agents.core.cursor import ReplayCursor, StepRecord
from beam_agents.core.staging import APPROVAL_TOOL_NAME, Staged
from beam_agents.core.tracing import DEADLINE_ATTRIBUTE, TraceRecorder

DEADLINE_APPROVER = "beam-agents/deadline"
"""The ``approver`` recorded when a suspension's deadline answers a pending approval "no"."""


@dataclass(frozen=True, slots=True)
class Resumption:
    """What resumes a suspended run: the admitted result or approval and the run so far."""

    result: ToolResult | None
    approval: Approval | None
    snapshot: bytes
    results: Mapping[str, ToolResult]
    pending: tuple[tuple[str, int], ...]
    """Still-unanswered ``(intent_id, kind)`` pairs, in staging order."""
    tokens_used: int = 0
    """Tokens the run's earlier activations spent."""
    steps: Sequence[StepRecord] = ()
    """The run's recorded steps (``steps[i]`` is step ``i``): the replay prefix."""
    namespace: str | None = None
    """The intent namespace the run started in; all its intent ids are minted in it."""
    approvals: Mapping[str, Approval] = field(default_factory=dict)
    """Every approval decision the run received so far, by intent id."""
    compensations: Sequence[CompensationLink] = ()
    """The run's compensation links (``ctx.compensate`` looks them up)."""


def pending_of(continuation: Continuation) -> list[tuple[str, int]]:
    """The run's unanswered ``(intent_id, kind)`` pairs, in staging order."""
    return list(zip(continuation.pending_intent_ids, continuation.pending_kinds, strict=True))


def pending_kind(continuation: Continuation, intent_id: str) -> int:
    """The ``ToolIntent.Kind`` of the pending intent ``intent_id``."""
    return continuation.pending_kinds[list(continuation.pending_intent_ids).index(intent_id)]


def admit(suspended: Continuation, answer: ToolResult | Approval) -> Continuation:
    """The run with ``answer`` (to one of its pending intents) applied."""
    admitted = _copy(suspended)
    pending = pending_of(suspended)
    del pending[[intent_id for intent_id, _ in pending].index(answer.intent_id)]
    _set_pending(admitted, pending)
    _answer(admitted, answer)
    return admitted


def resumption(admitted: Continuation, answer: ToolResult | Approval) -> Resumption:
    """What the activation that ``answer`` starts resumes from (``admitted`` includes it)."""
    is_approval = isinstance(answer, Approval)
    return Resumption(
        result=None if is_approval else answer,  # type: ignore[arg-type]
        approval=answer if is_approval else None,  # type: ignore[arg-type]
        snapshot=admitted.snapshot,
        results={result.intent_id: result for result in admitted.results},
        pending=tuple(pending_of(admitted)),
        tokens_used=admitted.tokens_used,
        steps=admitted.steps,
        namespace=run_namespace(admitted),
        approvals={approval.intent_id: approval for approval in admitted.approvals},
        compensations=admitted.compensations,
    )


def run_namespace(continuation: Continuation) -> str | None:
    """The intent namespace of a suspended run (``None``: the default ids)."""
    return continuation.intent_namespace or None


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
    """The continuation a ``Suspend`` persists (and its ``SUSPENDED`` trace).

    ``base`` is the resumed run with its answer admitted, or ``None`` for a new run, which
    starts at ``started_at_ms`` (a resumed run keeps its own start).
    """
    pending = staged.pending_after()
    next_step = staged.cursor.high_water_step
    attributes = {"pending": str(len(pending))}
    if deadline_ms:
        attributes[DEADLINE_ATTRIBUTE] = str(deadline_ms)
    staged.trace.record(TraceEvent.SUSPENDED, next_step, staged.closing_attributes(attributes))
    suspended = Continuation(started_at_ms=started_at_ms) if base is None else _copy(base)
    suspended.seq = seq
    _append_steps(suspended, staged.new_steps)
    suspended.next_step = next_step
    suspended.snapshot = snapshot
    suspended.adapter = adapter
    _set_pending(suspended, pending)
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

    The new intent is made at ``trace``'s event time and traced there, with the ``SUSPENDED``.
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
    asked = Staged(trace, ReplayCursor(step), namespace=run_namespace(suspended))
    asked.stage_intent(
        ToolIntent.APPROVAL,
        APPROVAL_TOOL_NAME,
        args_json,
        intent_ttl_ms,
        channel,
        required_approvals=required_approvals,
    )
    [intent] = asked.intents
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
    _append_steps(escalated, [(StepRecord.ESCALATION, digest) for _, digest in asked.new_steps])
    kept.append((intent.intent_id, ToolIntent.APPROVAL))
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
    """Record the run's fresh steps, if its records cover every step it took so far.

    A run whose records do not (its continuation was written before steps were recorded, so it
    has none) never replays, and keeps no records.
    """
    if len(continuation.steps) != continuation.next_step:
        del continuation.steps[:]
        return
    continuation.steps.extend(
        StepRecord(kind=kind, digest=digest)  # type: ignore[arg-type]
        for kind, digest in steps
    )
