"""The local loop: events -> RunAgent -> effector -> results -> RunAgent, on the default runner.

An order agent ships small orders through the effector (a side effect: ``ctx.act`` stages it
and the run suspends for up to ten minutes, resuming as soon as the result comes back) and asks
a person about large ones (``ctx.request_approval``). Nobody answers here, so after one second
the ``HitlPolicy`` timeout route denies the large order; the effector refuses the unanswered
approval request once its own TTL has passed.

``ReadEnvelopes(target, events=...)`` publishes the events to the effector and reads them back
together with every result, so one source closes the loop on Beam's local runner; it stops once
the effector has been idle for ``stop_when_idle_s``. This is the loop the README shows.

Run it:  python examples/local_loop.py   (it starts an effector of its own for the run)
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from beam_agents import (
    ActivationContext,
    AgentConfig,
    AgentEnvelope,
    Complete,
    Deny,
    FallbackContext,
    HitlPolicy,
    ReadEnvelopes,
    RunAgent,
    SubmitIntents,
    Suspend,
    ToolRegistry,
    tool,
)

import apache_beam as beam


@tool(side_effect=True)
def ship(order: str) -> str:
    """Hand the order to the warehouse. Executed by the effector, never in the pipeline."""
    return f"shipped {order}"


def make_registry() -> ToolRegistry:
    """The tools the effector may run (and whose arguments ``ctx.act`` validates)."""
    return ToolRegistry([ship])


def deny_unanswered(fallback: FallbackContext) -> Deny:
    """Nobody decided in time: refuse the order."""
    return Deny(b"denied " + fallback.snapshot)


POLICY = HitlPolicy(
    timeout_ms=1_000,  # how long a person has to answer
    intent_ttl_ms=2_000,  # when the effector refuses the unanswered request
    approval_channel="order-desk",
    on_timeout=deny_unanswered,
)


async def orders(ctx: ActivationContext) -> Complete | Suspend:
    """Ship small orders; ask about large ones; finish when the effector answers."""
    if ctx.is_resume:
        return Complete(output=b"done " + ctx.snapshot)
    order = json.loads(ctx.event)
    if order["amount"] > 1_000:
        ctx.request_approval({"order": order["id"], "amount": order["amount"]})
        return Suspend(snapshot=order["id"].encode())
    ctx.act("ship", {"order": order["id"]})
    return Suspend(snapshot=order["id"].encode(), timeout_ms=600_000)


def make_events() -> list[AgentEnvelope]:
    """Four orders on four keys; the first is large."""
    return [
        AgentEnvelope(
            entity_key=f"customer-{n}".encode(),
            event_time_ms=1_000 + n,
            external_event=json.dumps({"id": f"o-{n}", "amount": 5_000 if n == 0 else 20}).encode(),
        )
        for n in range(4)
    ]


# --8<-- [start:run]
def run(target: str, out_dir: str, **pipeline_args: Any) -> None:
    """The loop: read events and results from the effector, run the agent, submit its intents."""
    with beam.Pipeline(**pipeline_args) as pipeline:
        events = pipeline | ReadEnvelopes(target, events=make_events(), stop_when_idle_s=1.0)
        outputs = events | RunAgent(
            orders, config=AgentConfig(hitl_policy=POLICY, tool_registry=make_registry())
        )
        outputs.intents | SubmitIntents(target)
        outputs.output | beam.Map(bytes.decode) | beam.io.WriteToText(f"{out_dir}/decisions")


# --8<-- [end:run]


def read_lines(out_dir: str) -> list[str]:
    """Every line ``run`` wrote to ``out_dir``, sorted."""
    paths = Path(out_dir).glob("decisions-*")
    return sorted(line for path in paths for line in path.read_text().splitlines())


def main() -> None:
    """Start an effector, run the loop against it, print the outcomes."""
    from effector import EffectorThread  # the sidecar, in this process for the demo

    with tempfile.TemporaryDirectory() as scratch:
        with EffectorThread(f"sqlite:///{scratch}/effector.db", make_registry()) as effector:
            run(effector.address, scratch)
        for line in read_lines(scratch):
            print(f"local_loop: {line}")
    print("local_loop: ok")


if __name__ == "__main__":
    main()
