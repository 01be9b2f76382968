"""Intents and resume: an agent that asks the effector for two things and waits for both.

Placing an order means reserving stock and charging the card, both side effects. The agent
stages them with ``ctx.act`` (nothing executes in the pipeline), returns ``Suspend``, and is
resumed once per result as the results come back on the same key. It suspends again while
anything is still pending and completes when both have answered, in whatever order.

There is no effector here: the results are fed back with a ``TestStream``, exactly as the
effector would publish them, in the reverse of the order the intents were staged. The intent
ids they answer are known in advance, because an intent id is a pure function of the key, the
run's ``seq`` and the step position: ``intent_id_for(key, seq, step)``. A message that arrives
for the key while it is suspended waits and runs, as the key's next run, once the order is done.

Run it:  python examples/intents_and_resume.py
"""

from __future__ import annotations

import json

from beam_agents import (
    ActivationContext,
    AgentConfig,
    Complete,
    RunAgent,
    Suspend,
    ToolRegistry,
    ToolResult,
    canonical_json_bytes,
    intent_id_for,
    tool,
)
from beam_agents.testing import EnvelopeStream, streaming_pipeline

import apache_beam as beam
from apache_beam.testing.util import assert_that, equal_to

ORDER_KEY = b"order-1001"


@tool(side_effect=True)
def reserve_stock(sku: str, quantity: int) -> str:
    """Reserve stock in the warehouse. Executed by the effector, never in the pipeline."""
    return f"reserved {quantity} x {sku}"


@tool(side_effect=True)
def charge_card(customer: str, amount_cents: int) -> str:
    """Charge the customer's card. Executed by the effector, never in the pipeline."""
    return f"charged {amount_cents} to {customer}"


def make_registry() -> ToolRegistry:
    """Registering the side-effecting tools lets ``ctx.act`` validate their arguments."""
    return ToolRegistry([reserve_stock, charge_card])


async def place_order(ctx: ActivationContext) -> Complete | Suspend:
    """Reserve and charge, wait for both, then confirm; other messages are acknowledged."""
    if ctx.is_resume:
        if ctx.pending_intent_ids:
            return Suspend(snapshot=ctx.snapshot)
        statuses = sorted(ToolResult.Status.Name(r.status) for r in ctx.results.values())
        return Complete(output=ctx.snapshot + b" confirmed: " + ",".join(statuses).encode())
    order = json.loads(ctx.event)
    if order.get("kind") != "order":
        return Complete(output=b"message seq %d: %s" % (ctx.seq, order["text"].encode()))
    ctx.act("reserve_stock", {"sku": order["sku"], "quantity": order["quantity"]})
    ctx.act("charge_card", {"customer": order["customer"], "amount_cents": order["amount"]})
    return Suspend(snapshot=b"order " + order["id"].encode())


def main() -> None:
    """Place one order, feed the effector's results back in reverse, check the outcome."""
    reserve_id = intent_id_for(ORDER_KEY, 0, 0)
    charge_id = intent_id_for(ORDER_KEY, 0, 1)
    order = {"kind": "order", "id": "1001", "sku": "kb-9", "quantity": 2}
    order |= {"customer": "c-77", "amount": 12_900}
    stream = (
        EnvelopeStream()
        .event(ORDER_KEY, canonical_json_bytes(order), at_ms=1_000)
        .event(ORDER_KEY, canonical_json_bytes({"text": "where is it?"}), at_ms=1_500)
        .result(ORDER_KEY, charge_id, payload=b'"charged 12900 to c-77"', at_ms=2_000)
        .result(ORDER_KEY, reserve_id, payload=b'"reserved 2 x kb-9"', at_ms=3_000)
    )
    with streaming_pipeline() as pipeline:
        outputs = (
            pipeline
            | "Envelopes" >> stream.build()
            | "Orders" >> RunAgent(place_order, config=AgentConfig(tool_registry=make_registry()))
        )
        assert_that(
            outputs.output,
            equal_to([b"order 1001 confirmed: OK,OK", b"message seq 1: where is it?"]),
            label="outputs",
        )
        staged = outputs.intents | "Staged" >> beam.Map(
            lambda intent: (intent.intent_id, intent.tool_name, intent.seq, intent.step_index)
        )
        assert_that(
            staged,
            equal_to(
                [
                    (reserve_id, "reserve_stock", 0, 0),
                    (charge_id, "charge_card", 0, 1),
                ]
            ),
            label="intents",
        )
        assert_that(outputs.errors, equal_to([]), label="no errors")
    print(f"intents_and_resume: staged reserve_stock as {reserve_id}")
    print(f"intents_and_resume: staged charge_card as {charge_id}")
    print("intents_and_resume: resumed twice, confirmed once, then ran the waiting message")
    print("intents_and_resume: ok")


if __name__ == "__main__":
    main()
