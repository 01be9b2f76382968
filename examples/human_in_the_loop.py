"""Human in the loop: large refunds wait for a person, and silence is a "no".

A refund agent pays small refunds at once (as an intent for the effector) and asks a human
about large ones with ``ctx.request_approval``, suspending until the decision comes back. The
``HitlPolicy`` decides what happens when nobody answers: here its timeout route denies the
refund, so an unanswered request fails closed instead of hanging or paying out.

Three refunds arrive. The small one is paid immediately. A reviewer approves the first large
one in time, and the agent resumes and stages the payment. Nobody answers the second large one;
when processing time passes the policy's timeout, the route emits a denial.

The reviewer and the clock are simulated with a ``TestStream`` (the approval is published as
the effector would, and ``advance_processing_time`` moves the clock the deadline timer runs
on). ``RunAgent`` places deadlines on that test clock by itself.

Run it:  python examples/human_in_the_loop.py
"""

from __future__ import annotations

import json

from beam_agents import (
    ActivationContext,
    AgentConfig,
    Complete,
    Deny,
    FallbackContext,
    HitlPolicy,
    RunAgent,
    Suspend,
    ToolIntent,
    ToolRegistry,
    canonical_json_bytes,
    intent_id_for,
    tool,
)
from beam_agents.testing import EnvelopeStream, streaming_pipeline

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to

LARGE_REFUND_CENTS = 50_000
DECISION_TIMEOUT_MS = 60_000


@tool(side_effect=True)
def pay_refund(refund: str, cents: int) -> str:
    """Pay a refund; side-effecting, so only an effector runs it (registered so ctx.act checks it).

    Args:
        refund: The refund's id.
        cents: How much to pay back, in cents.
    """
    return f"paid {refund}: {cents}"


def deny_unanswered(fallback: FallbackContext) -> Deny:
    """Nobody decided in time: refuse the refund (a pure function of what it is given)."""
    refund = json.loads(fallback.snapshot)
    return Deny(f"refund {refund['id']} denied: no decision in time".encode())


def make_policy() -> HitlPolicy:
    """Ask the refund reviewers; deny when they do not answer within the timeout."""
    return HitlPolicy(
        timeout_ms=DECISION_TIMEOUT_MS,
        intent_ttl_ms=DECISION_TIMEOUT_MS,
        approval_channel="refund-reviewers",
        on_timeout=deny_unanswered,
    )


async def refunds(ctx: ActivationContext) -> Complete | Suspend:
    """Pay small refunds, ask about large ones, pay what a reviewer approves."""
    if ctx.is_resume:
        refund = json.loads(ctx.snapshot)
        decision = ctx.resume_approval
        if decision is None or not decision.approved:
            return Complete(output=f"refund {refund['id']} declined".encode())
        ctx.act("pay_refund", {"refund": refund["id"], "cents": refund["cents"]})
        return Complete(output=f"refund {refund['id']} approved by {decision.approver}".encode())
    refund = json.loads(ctx.event)
    if refund["cents"] < LARGE_REFUND_CENTS:
        ctx.act("pay_refund", {"refund": refund["id"], "cents": refund["cents"]})
        return Complete(output=f"refund {refund['id']} paid".encode())
    ctx.request_approval({"refund": refund["id"], "cents": refund["cents"]})
    return Suspend(snapshot=ctx.event)


def refund_event(refund_id: str, cents: int) -> bytes:
    """The JSON payload of a refund request."""
    return canonical_json_bytes({"id": refund_id, "cents": cents})


def main() -> None:
    """Run three refunds past a simulated reviewer and clock, and check every decision."""
    approved_key, ignored_key = b"customer-1", b"customer-2"
    approval_id = intent_id_for(approved_key, 0, 0)
    stream = (
        EnvelopeStream()
        .event(b"customer-3", refund_event("r-3", 1_999), at_ms=1_000)
        .event(approved_key, refund_event("r-1", 75_000), at_ms=1_000)
        .event(ignored_key, refund_event("r-2", 99_000), at_ms=1_000)
        .approval(approved_key, approval_id, approved=True, approver="dana", at_ms=30_000)
        .advance_processing_time(DECISION_TIMEOUT_MS + 1_000)
    )
    config = AgentConfig(hitl_policy=make_policy(), tool_registry=ToolRegistry([pay_refund]))
    with streaming_pipeline() as pipeline:
        outputs = (
            pipeline | "Refunds" >> stream.build() | "Agent" >> RunAgent(refunds, config=config)
        )
        assert_that(
            outputs.output,
            equal_to(
                [
                    b"refund r-3 paid",
                    b"refund r-1 approved by dana",
                    b"refund r-2 denied: no decision in time",
                ]
            ),
            label="decisions",
        )
        kinds = outputs.intents | "Kinds" >> beam.Map(
            lambda intent: (
                intent.entity_key,
                intent.tool_name or ToolIntent.Kind.Name(intent.kind),
                intent.channel,
            )
        )
        assert_that(
            kinds,
            equal_to(
                [
                    (b"customer-3", "pay_refund", ""),
                    (approved_key, "approval", "refund-reviewers"),
                    (approved_key, "pay_refund", ""),
                    (ignored_key, "approval", "refund-reviewers"),
                    # The deny route ended the wait: the unanswered approval is withdrawn.
                    (ignored_key, "WITHDRAWAL", ""),
                ]
            ),
            label="intents",
        )
        assert_that(outputs.errors, equal_to([]), label="no errors")
    print("human_in_the_loop: refund r-3 paid without asking")
    print("human_in_the_loop: refund r-1 approved by dana, then paid")
    print("human_in_the_loop: refund r-2 denied when nobody answered in time")
    print("human_in_the_loop: ok")


if __name__ == "__main__":
    main()
