# mypy: disallow-untyped-calls=False
"""One pipeline of the budget gate (``test_budget_gate``), run as its own worker process.

``python -m tests.semantics.budget_pipeline N TARGET MARKERS SEED OUT``: pipeline ``N`` runs
:func:`ask` over its keys' events on the BundleBasedDirectRunner (streaming), with 1% of its
commits forced to fail once, leasing from and submitting its debits to the replicas in TARGET;
it writes its outputs, one per line, and its provider calls to OUT.
"""

from __future__ import annotations

import json
import random
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import apache_beam as beam
from apache_beam.coders import BytesCoder, ProtoCoder, TupleCoder
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
from apache_beam.testing import test_stream
from apache_beam.transforms.window import TimestampedValue

from beam_agents import AgentConfig, Budget, BudgetExceeded, Complete, RunAgent, SubmitIntents
from beam_agents._protos import AgentEnvelope
from beam_agents.core.context import ActivationContext
from beam_agents.io import EffectorConnection
from beam_agents.model.client import LlmRequest, LlmResponse, ModelClient, TokenUsage
from tests.io.io_harness import Collector
from tests.semantics.test_retry_gate import FailChosenCommits

KEYS_PER_PIPELINE = 100
EVENTS_PER_KEY = 5
CAP_TOKENS = 6_000
CHUNK_TOKENS = 120
"""The cap admits about 60% of the 1,000 calls; each worker leases 120 tokens at a time."""
BUDGET = "gate-budget"
STEP_SIZE = 50

_CALLS: dict[str, int] = {}
_CALLS_LOCK = threading.Lock()


def usage_of(key: bytes, event: int) -> TokenUsage:
    """A call's usage: it depends on the key and the event, so every sum is checked."""
    number = int(key.split(b"-")[-1])
    return TokenUsage(input_tokens=3 + number % 5, output_tokens=1 + (number + event) % 4)


class GateModel(ModelClient):
    """Answers every call at once with the usage :func:`usage_of` gives; counts its calls."""

    def __init__(self, pipeline: str) -> None:
        self._pipeline = pipeline

    async def complete(self, request: LlmRequest) -> LlmResponse:
        message = request.messages[0]
        key, event = str(message["content"] if isinstance(message, dict) else message).split()
        with _CALLS_LOCK:
            _CALLS[self._pipeline] = _CALLS.get(self._pipeline, 0) + 1
        return LlmResponse(response=b"fine", usage=usage_of(key.encode(), int(event)))


class _Provider:
    def __init__(self, pipeline: str) -> None:
        self._pipeline = pipeline

    def __call__(self) -> GateModel:
        return GateModel(self._pipeline)


async def ask(ctx: ActivationContext) -> Complete:
    """Ask the model once; complete with the tokens it used, or ``over`` when refused."""
    key, event = ctx.entity_key.decode(), ctx.event.decode()
    try:
        answer = await ctx.call_model(LlmRequest(model_id="gate", messages=[f"{key} {event}"]))
    except BudgetExceeded:
        return Complete(output=b"over")
    return Complete(output=f"ok {answer.usage.total_tokens}".encode())


def keys_of(pipeline: int) -> list[bytes]:
    first = pipeline * KEYS_PER_PIPELINE
    return [f"key-{n:03d}".encode() for n in range(first, first + KEYS_PER_PIPELINE)]


def envelopes(pipeline: int) -> list[AgentEnvelope]:
    return [
        AgentEnvelope(
            entity_key=key, event_time_ms=1_000 + event, external_event=str(event).encode()
        )
        for event in range(EVENTS_PER_KEY)
        for key in keys_of(pipeline)
    ]


def source_of(events: list[AgentEnvelope]) -> Callable[[beam.Pipeline], object]:
    def source(pipeline: beam.Pipeline) -> object:
        stream = test_stream.TestStream(coder=TupleCoder([BytesCoder(), ProtoCoder(AgentEnvelope)]))
        for start in range(0, len(events), STEP_SIZE):
            stream.add_elements(
                [
                    TimestampedValue((e.entity_key, e), e.event_time_ms / 1000)
                    for e in events[start : start + STEP_SIZE]
                ]
            )
        stream.advance_watermark_to_infinity()
        return pipeline | "Stream" >> stream.with_output_types(tuple[bytes, AgentEnvelope])

    return source


def run_with_debits(
    events: list[AgentEnvelope], config: AgentConfig, connection: EffectorConnection
) -> list[bytes]:
    """Run ``ask`` over ``events`` as a streaming pipeline whose ``.intents`` (the calls'
    debits) go to the effector through ``SubmitIntents``; returns the outputs."""
    outputs = Collector.new()
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = True
    pipeline = beam.Pipeline(runner=BundleBasedDirectRunner(), options=options)
    ran = source_of(events)(pipeline) | RunAgent(ask, config=config)
    ran.output | "Outputs" >> outputs.sink()
    ran.intents | SubmitIntents(connection)
    pipeline.run().wait_until_finish()
    return [bytes(value) for value in outputs.values()]


def chosen(rng: random.Random, events: list[AgentEnvelope]) -> frozenset[tuple[bytes, str]]:
    """1% of the pipeline's activations: every event activation of one key, picked at random."""
    return frozenset({(rng.choice(events).entity_key, "event")})


def main(argv: list[str]) -> None:
    """Run pipeline ``argv[0]`` against ``argv[1]``; write what it did to ``argv[4]``."""
    pipeline, target, markers, seed, out = int(argv[0]), argv[1], Path(argv[2]), argv[3], argv[4]
    events = envelopes(pipeline)
    markers.mkdir(parents=True, exist_ok=True)
    forced = FailChosenCommits(markers, chosen(random.Random(f"{seed}/{pipeline}"), events))
    connection = EffectorConnection(target)
    config = AgentConfig(
        provider_factory=_Provider(f"p{pipeline}"),
        budget=Budget(BUDGET, connection, tokens=CAP_TOKENS, chunk_tokens=CHUNK_TOKENS),
        before_commit=forced,
    )
    outputs = run_with_debits(events, config, connection)
    figures = {
        "outputs": [output.decode() for output in outputs],
        "provider_calls": sum(_CALLS.values()),
        "forced_retries": len(forced.first_commit.forced()),
    }
    Path(out).write_text(json.dumps(figures))


if __name__ == "__main__":
    # Run the module's own copy, so the DoFns (pickled by reference) count in its _CALLS.
    from tests.semantics.budget_pipeline import main as run_module

    run_module(sys.argv[1:])
