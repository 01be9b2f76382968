# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated.)
"""Running RunAgent in tests, and what several rule-family test modules share.

``run_agent`` runs a pipeline and collects its four outputs as Python values;
``InMemoryKeyState`` drives one key through ``AgentDoFn`` without a runner. Below them: the
tools, agents and scenarios more than one test module uses, kept here once.
"""

from __future__ import annotations

import functools
import inspect
import json
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from beam_agents import (
    AgentConfig,
    Complete,
    Escalate,
    FallbackContext,
    HitlPolicy,
    RunAgent,
    Suspend,
    intent_id_for,
)
from beam_agents._protos import AgentEnvelope, AgentError, KeyHeader, ToolIntent, TraceEvent
from beam_agents.core.context import ActivationContext, AgentFn
from beam_agents.core.observability import identity_of
from beam_agents.core.state import BUFFERED_MARK
from beam_agents.io.run_agent import AgentDoFn, agent_dofn
from beam_agents.model.client import LlmRequest
from beam_agents.model.fake import FakeLLM, match_contains, respond_with
from beam_agents.testing import EnvelopeStream
from beam_agents.tools import ToolRegistry
from tests.seed import freeze_account, risk_band

# Collected elements, by run token. The runners used here execute DoFns in this process, so a
# module-level store reached by reference is visible to the test that started the pipeline.
_COLLECTED: dict[str, list[tuple[str, Any]]] = {}
_LOCK = threading.Lock()


class _Collect(beam.DoFn):  # type: ignore[misc]
    def __init__(self, token: str, tag: str) -> None:
        self._token = token
        self._tag = tag

    def process(self, element: Any) -> None:
        with _LOCK:
            _COLLECTED.setdefault(self._token, []).append((self._tag, element))


_PROVIDERS: dict[str, FakeLLM] = {}


class SharedProvider:
    """A ``provider_factory`` returning one FakeLLM to every DoFn instance in this process.

    Only a token is pickled with the DoFn, so every deserialized copy (one per bundle on the
    BundleBasedDirectRunner) reaches the same FakeLLM, and the test can count its calls.
    """

    def __init__(self, fake: FakeLLM) -> None:
        self._token = uuid.uuid4().hex
        _PROVIDERS[self._token] = fake

    def __call__(self) -> FakeLLM:
        return _PROVIDERS[self._token]

    @property
    def fake(self) -> FakeLLM:
        return _PROVIDERS[self._token]


@dataclass
class Outputs:
    output: list[bytes] = field(default_factory=list)
    intents: list[ToolIntent] = field(default_factory=list)
    traces: list[TraceEvent] = field(default_factory=list)
    errors: list[AgentError] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    """The pipeline's ``beam_agents`` counters (attempted values: retried bundles included).

    Complete on the FnApiRunner; the BundleBasedDirectRunner in streaming mode reports only
    part of its bundles' metrics (measured with a plain counting DoFn), so do not assert on
    them there."""

    def traces_for(self, key: bytes) -> list[TraceEvent]:
        """The key's trace events in emission order (by seq, then sequence)."""
        events = [event for event in self.traces if event.entity_key == key]
        return sorted(events, key=lambda event: (event.seq, event.sequence, event.event_type))

    def event_types(self, key: bytes) -> list[str]:
        return [TraceEvent.EventType.Name(event.event_type) for event in self.traces_for(key)]

    def reasons(self) -> list[str]:
        return sorted(error.reason for error in self.errors)


def event(key: bytes, payload: bytes, at_ms: int = 1_000) -> tuple[bytes, AgentEnvelope]:
    return key, AgentEnvelope(entity_key=key, event_time_ms=at_ms, external_event=payload)


def created(elements: Iterable[Any], *, typed: bool = True) -> Callable[[beam.Pipeline], Any]:
    """A source of fixed elements (typed as (bytes, AgentEnvelope) pairs unless told not to)."""
    values = list(elements)

    def source(pipeline: beam.Pipeline) -> Any:
        create = beam.Create(values)
        if typed:
            create = create.with_output_types(tuple[bytes, AgentEnvelope])
        return pipeline | "Source" >> create

    return source


def streamed(stream: EnvelopeStream) -> Callable[[beam.Pipeline], Any]:
    def source(pipeline: beam.Pipeline) -> Any:
        return pipeline | "Source" >> stream.build()

    return source


def run_agent(
    source: Callable[[beam.Pipeline], Any],
    agent: AgentFn,
    config: AgentConfig | None = None,
    *,
    streaming: bool = False,
    read: tuple[str, ...] = ("output", "intents", "traces", "errors"),
) -> Outputs:
    """Run ``agent`` over ``source`` and collect the outputs named in ``read``.

    Batch runs use the FnApiRunner; streaming runs (TestStream) the BundleBasedDirectRunner,
    which supports processing-time timers and retries failed bundles.
    """
    token = uuid.uuid4().hex
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = streaming
    runner = BundleBasedDirectRunner() if streaming else FnApiRunner()
    pipeline = beam.Pipeline(runner=runner, options=options)
    outputs = source(pipeline) | "Agent" >> RunAgent(agent, config=config or AgentConfig())
    for tag in read:
        getattr(outputs, tag) | f"Collect_{tag}" >> beam.ParDo(_Collect(token, tag))
    result = pipeline.run()
    result.wait_until_finish()
    collected = Outputs()
    query = result.metrics().query(MetricsFilter().with_namespace("beam_agents"))
    for counter in query["counters"]:
        name = counter.key.metric.name
        collected.counters[name] = collected.counters.get(name, 0) + counter.attempted
    with _LOCK:
        items = _COLLECTED.pop(token, [])
    for tag, element in items:
        getattr(collected, tag).append(element)
    return collected


class InMemoryBag:
    """An in-memory ``Bag`` state cell that counts its reads."""

    def __init__(self) -> None:
        self.values: list[bytes] = []
        self.reads = 0

    def read(self) -> list[bytes]:
        self.reads += 1
        return list(self.values)

    def add(self, value: bytes) -> None:
        self.values.append(value)

    def clear(self) -> None:
        self.values.clear()


class RecordingTimer:
    """An in-memory timer: the time it is set to, or ``None`` once cleared."""

    def __init__(self) -> None:
        self.at: object = None

    def set(self, timestamp: object) -> None:
        self.at = timestamp

    def clear(self) -> None:
        self.at = None


class InMemoryKeyState:
    """One key's state cells and timers, for driving ``AgentDoFn`` without a runner.

    Lets a test see exactly which cells an element reads and writes, which a pipeline hides.
    """

    def __init__(self) -> None:
        self.header = InMemoryBag()
        self.memory = InMemoryBag()
        self.deadline = RecordingTimer()
        self.idle = RecordingTimer()

    @property
    def continuation(self) -> StoredContinuation:
        """The suspended run's continuation as the header stores it."""
        return StoredContinuation(self.header)

    @property
    def buffered(self) -> list[bytes]:
        """The events buffered behind the suspended run, as the header bag holds them."""
        return [value[1:] for value in self.header.values if value[:1] == BUFFERED_MARK]

    @property
    def headers(self) -> list[bytes]:
        """The header elements of the header bag, oldest first: the last one counts."""
        return [value for value in self.header.values if value[:1] != BUFFERED_MARK]

    def params(self) -> dict[str, Any]:
        """The state and timer arguments ``process`` and the timer callbacks take."""
        return {
            "header": self.header,
            "memory": self.memory,
            "deadline": self.deadline,
            "idle": self.idle,
        }

    def process(self, dofn: AgentDoFn, key: bytes, envelope: AgentEnvelope) -> list[Any]:
        """Deliver ``envelope`` on ``key`` to ``dofn.process`` over these cells."""
        bound = _bound_cells(type(dofn))  # the idle timer only under a TTL
        cells = {name: cell for name, cell in self.params().items() if name in bound}
        outputs: list[Any] = dofn.process((key, envelope), **cells)
        return outputs


class StoredContinuation:
    """The continuation field of a header bag's header, read and written as bytes or ``None``."""

    def __init__(self, header: InMemoryBag) -> None:
        self._header = header

    @property
    def value(self) -> bytes | None:
        headers = [value for value in self._header.values if value[:1] != BUFFERED_MARK]
        return (KeyHeader.FromString(headers[-1]).continuation or None) if headers else None

    @value.setter
    def value(self, blob: bytes | None) -> None:
        values = self._header.values
        headers = [value for value in values if value[:1] != BUFFERED_MARK]
        header = KeyHeader.FromString(headers[-1]) if headers else KeyHeader(schema_version=1)
        header.continuation = blob or b""
        events = [value for value in values if value[:1] == BUFFERED_MARK]
        self._header.values = [header.SerializeToString(), *events]


@functools.cache
def _bound_cells(kind: type[AgentDoFn]) -> frozenset[str]:
    """The state and timer parameters ``kind.process`` takes (looked up once per class)."""
    return frozenset(inspect.signature(kind.process).parameters)


# -- shared tools and agents ----------------------------------------------------------------


def make_registry() -> ToolRegistry:
    """The seed example's tools, both of them (``act`` validates ``freeze_account``)."""
    return ToolRegistry([risk_band, freeze_account])


async def tally(ctx: ActivationContext) -> Complete:
    return Complete(output=ctx.entity_key + b":" + str(ctx.seq).encode())


async def fan_out(ctx: ActivationContext) -> Complete | Suspend:
    """Stage three lookups; complete only when every one has answered."""
    if not ctx.is_resume:
        for region in ("eu", "us", "ap"):
            ctx.act("lookup", {"region": region})
        return Suspend(snapshot=b"fan-out")
    if ctx.pending_intent_ids:
        return Suspend(snapshot=ctx.snapshot)
    answers = {intent_id: result.payload.decode() for intent_id, result in ctx.results.items()}
    return Complete(output=json.dumps(answers, sort_keys=True).encode())


def escalate(fallback: FallbackContext) -> Escalate:
    return Escalate()


def escalate_once() -> HitlPolicy:
    """A policy whose 5 s timeout escalates once, on the ``ops`` channel."""
    return HitlPolicy(
        timeout_ms=5_000,
        intent_ttl_ms=60_000,
        approval_channel="ops",
        on_timeout=escalate,
        max_escalations=1,
    )


# -- the order scenario: plan with the model, ship, summarize on the result -----------------

SCENARIO_KEY = b"order-1"
"""The key of the order and hold scenarios."""


def ask(text: str) -> LlmRequest:
    return LlmRequest(model_id="planner", messages=[{"role": "user", "content": text}])


def make_fake() -> FakeLLM:
    return FakeLLM(
        [
            (match_contains("plan"), respond_with(b"ship it")),
            (match_contains("summarize"), respond_with(b"shipped")),
        ]
    )


async def plan_then_summarize(ctx: ActivationContext) -> Complete | Suspend:
    if not ctx.is_resume:
        plan = await ctx.call_model(ask("plan " + ctx.event.decode()))
        ctx.act("ship", {"plan": plan.text})
        return Suspend(snapshot=plan.response)
    result = ctx.resume_result
    assert result is not None
    summary = await ctx.call_model(ask("summarize " + result.payload.decode()))
    ctx.act("notify", {"summary": summary.text, "plan": ctx.snapshot.decode()})
    return Complete(output=summary.response)


def order_stream() -> EnvelopeStream:
    return (
        EnvelopeStream()
        .event(SCENARIO_KEY, b"order", at_ms=1_000)
        .result(
            SCENARIO_KEY, intent_id_for(SCENARIO_KEY, 0, 1), payload=b'"tracking-1"', at_ms=2_000
        )
    )


def run_order(config: AgentConfig) -> Outputs:
    """Run ``plan_then_summarize`` over ``order_stream()`` on the streaming runner."""
    return run_agent(streamed(order_stream()), plan_then_summarize, config, streaming=True)


def fingerprint(outputs: Outputs) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """Intents and outputs byte for byte, traces by identity (without wall-clock times)."""
    return (
        sorted(intent.SerializeToString(deterministic=True) for intent in outputs.intents),
        sorted(identity_of(event) for event in outputs.traces),
        sorted(outputs.output),
    )


def calls_containing(fake: FakeLLM, text: str) -> int:
    return sum(text in str(request.messages) for request in fake.requests)


# -- the hold scenario: one key driven through AgentDoFn -------------------------------------

HOLD_TTL_MS = 60_000


async def hold_then_release(ctx: ActivationContext) -> Complete | Suspend:
    """Suspends on an event saying "hold" (one intent), completes on anything else."""
    if ctx.is_resume:
        return Complete(output=b"released")
    if ctx.event == b"hold":
        ctx.act("freeze", {"card": "7"})
        return Suspend()
    return Complete(output=b"done " + ctx.event)


def held_dofn() -> Iterator[AgentDoFn]:
    """The body of a fixture: ``hold_then_release`` in a set-up ``AgentDoFn``, torn down after."""
    runner = agent_dofn(hold_then_release, AgentConfig(ttl_ms=HOLD_TTL_MS))
    runner.setup()
    yield runner
    runner.teardown()


def hold_event(payload: bytes, at_ms: int) -> AgentEnvelope:
    return AgentEnvelope(entity_key=SCENARIO_KEY, event_time_ms=at_ms, external_event=payload)


def main_outputs(outputs: list[Any]) -> list[bytes]:
    return [output for output in outputs if isinstance(output, bytes)]


def header_of(cells: InMemoryKeyState) -> KeyHeader:
    assert cells.headers
    return KeyHeader.FromString(cells.headers[-1])
