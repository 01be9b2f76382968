# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated.)
"""Running RunAgent pipelines in tests and collecting their four outputs as Python values."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from beam_agents import AgentConfig, RunAgent
from beam_agents._protos import AgentEnvelope, AgentError, ToolIntent, TraceEvent
from beam_agents.core.agent import AgentFn
from beam_agents.core.dofn import AgentDoFn
from beam_agents.model.fake import FakeLLM
from beam_agents.testing import EnvelopeStream

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
) -> Outputs:
    """Run ``agent`` over ``source`` and collect its outputs.

    Batch runs use the FnApiRunner; streaming runs (TestStream) the BundleBasedDirectRunner,
    which supports processing-time timers and retries failed bundles.
    """
    token = uuid.uuid4().hex
    options = PipelineOptions()
    options.view_as(StandardOptions).streaming = streaming
    runner = BundleBasedDirectRunner() if streaming else FnApiRunner()
    pipeline = beam.Pipeline(runner=runner, options=options)
    outputs = source(pipeline) | "Agent" >> RunAgent(agent, config=config or AgentConfig())
    for tag in ("output", "intents", "traces", "errors"):
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


class CountingCell:
    """An in-memory ``ReadModifyWrite`` state cell that counts its reads."""

    def __init__(self) -> None:
        self.value: bytes | None = None
        self.reads = 0

    def read(self) -> bytes | None:
        self.reads += 1
        return self.value

    def write(self, value: bytes) -> None:
        self.value = value

    def clear(self) -> None:
        self.value = None


class InMemoryBag:
    """An in-memory ``Bag`` state cell."""

    def __init__(self) -> None:
        self.values: list[bytes] = []

    def read(self) -> list[bytes]:
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
        self.header = CountingCell()
        self.memory = CountingCell()
        self.cache = CountingCell()
        self.continuation = CountingCell()
        self.buffer = InMemoryBag()
        self.deadline = RecordingTimer()
        self.idle = RecordingTimer()

    def params(self) -> dict[str, Any]:
        """The state and timer arguments ``process`` and the timer callbacks take."""
        return {
            "header": self.header,
            "memory": self.memory,
            "cache": self.cache,
            "continuation": self.continuation,
            "buffer": self.buffer,
            "deadline": self.deadline,
            "idle": self.idle,
        }

    def process(self, dofn: AgentDoFn, key: bytes, envelope: AgentEnvelope) -> list[Any]:
        """Deliver ``envelope`` on ``key`` to ``dofn.process`` over these cells."""
        outputs: list[Any] = dofn.process((key, envelope), **self.params())
        return outputs
