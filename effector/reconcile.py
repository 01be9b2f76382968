"""Reconcile before re-executing: settling a claim whose earlier execution recorded no result.

A claim that is not an intent's first (:attr:`~effector.store.base.Claim.possibly_started`)
may find the effect already made: the earlier attempt started the tool and then its process
crashed, or its lease ran out, before the result was recorded. If the tool registered a
reconciler (``@tool.reconciler``), :func:`settle` asks it first: a found effect becomes the
OK result without executing; ``None`` lets the tool execute (or, past the intent's deadline,
refuses it as EXPIRED); a failure leaves the intent IN_DOUBT until a backoff has passed, never
executed on a guess. Without a reconciler nothing changes. See ``effector/README.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import effector.audit as audit
from beam_agents._protos import ToolResult, canonical_json_bytes
from beam_agents.tools import IntentInfo, ToolRegistry
from effector.intents import expired_result, new_result
from effector.runner import (
    MAX_ERROR_MESSAGE_CHARS,
    EffectorToolRunner,
    IntentRejectedError,
    prepare_call,
)
from effector.store.base import Claim

RETRY_FIRST_MS = 1_000
"""How long an intent stays IN_DOUBT after its reconciler's first failure."""
RETRY_LONGEST_MS = 300_000
"""The backoff doubles after each failure in a row, up to this (five minutes)."""


@dataclass(frozen=True, slots=True)
class Found:
    """The reconciler found the effect: record ``result`` (OK, its value) without executing."""

    result: ToolResult


@dataclass(frozen=True, slots=True)
class NotFound:
    """The reconciler says the effect did not happen: execute, unless past the deadline.

    ``expired`` is then the EXPIRED result to record instead (an IN_DOUBT intent is claimed
    again whatever its deadline, so only here can a claim be past it).
    """

    expired: ToolResult | None = None


@dataclass(frozen=True, slots=True)
class InDoubt:
    """The reconciler failed: leave the intent IN_DOUBT, asking again after ``retry_in_ms``."""

    reason: str
    retry_in_ms: int


Settlement = Found | NotFound | InDoubt


def retry_delay_ms(failures: int) -> int:
    """The IN_DOUBT backoff after ``failures`` failures in a row: 1 s, doubling, at most 5 min."""
    doublings = min(max(failures - 1, 0), 20)
    return min(RETRY_FIRST_MS << doublings, RETRY_LONGEST_MS)


async def settle(
    runner: EffectorToolRunner,
    registry: ToolRegistry,
    claim: Claim,
    clock: Callable[[], int],
) -> Settlement | None:
    """Ask the reconciler of a possibly started claim's tool what became of its effect.

    ``None`` when there is nothing to ask: a first attempt, a tool without a reconciler, or an
    intent that cannot run (its execution rejects it as usual); but an intent past its deadline
    (one claimed again from IN_DOUBT) is never executed: ``NotFound`` with its EXPIRED result.
    The intent id, key and attempt reach the reconciler as ``IntentInfo``, the validated
    arguments as ``args``.
    """
    if not claim.possibly_started:
        return None
    intent = claim.intent
    try:
        tool, kwargs = prepare_call(registry, intent)
    except IntentRejectedError:
        return None
    if tool.reconcile_with is None:
        return _not_found(claim, clock()) if _past_deadline(claim, clock()) else None
    info = IntentInfo(
        intent.intent_id, intent.entity_key, intent.seq, intent.step_index, claim.attempt
    )
    try:
        answer = await runner.reconcile(tool, kwargs, info)
        payload = None if answer is None else canonical_json_bytes(answer.value)
    # A reconciler that calls sys.exit() failed; it does not stop the effector.
    except (Exception, SystemExit) as exc:
        reason = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_MESSAGE_CHARS]
        delay_ms = retry_delay_ms(claim.reconcile_failures + 1)
        audit.in_doubt(intent, claim.attempt, reason, delay_ms)
        return InDoubt(reason, delay_ms)
    now_ms = clock()
    if payload is None:
        return _not_found(claim, now_ms)
    audit.reconciled(intent, claim.attempt)
    return Found(
        new_result(
            intent, ToolResult.OK, completed_at_ms=now_ms, attempt=claim.attempt, payload=payload
        )
    )


def _past_deadline(claim: Claim, now_ms: int) -> bool:
    return bool(claim.deadline_ms) and now_ms > claim.deadline_ms


def _not_found(claim: Claim, now_ms: int) -> NotFound:
    """Execute; or, past the deadline, record EXPIRED (counting the interrupted attempts)."""
    if not _past_deadline(claim, now_ms):
        return NotFound()
    return NotFound(expired_result(claim.intent, now_ms=now_ms, attempts=claim.attempt - 1))
