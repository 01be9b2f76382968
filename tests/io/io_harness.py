"""Helpers for the io tests: pipelines on FnApiRunner, their outputs and metrics, intents."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.runners.runner import PipelineResult
from effector_harness import make_intent
from effector_test_tools import LedgerRow

from beam_agents._protos import IntentDeadLetter, SubmitAck, ToolIntent
from beam_agents.io import SubmitIntents

# FnApiRunner runs DoFns in this process, so a module-level store reached by a token is
# visible to the test that started the pipeline.
_COLLECTED: dict[str, list[tuple[Any, int]]] = {}
_LOCK = threading.Lock()


class _Collect(beam.DoFn):
    def __init__(self, token: str) -> None:
        self._token = token

    def process(self, element: Any, timestamp: Any = beam.DoFn.TimestampParam) -> None:
        with _LOCK:
            _COLLECTED.setdefault(self._token, []).append((element, timestamp.micros))


@dataclass
class Collector:
    """Collects one PCollection's elements, in arrival order, with their timestamps."""

    token: str

    @classmethod
    def new(cls) -> Collector:
        return cls(uuid.uuid4().hex)

    def sink(self) -> beam.ParDo:
        return beam.ParDo(_Collect(self.token))

    def timestamped(self) -> list[tuple[Any, int]]:
        with _LOCK:
            return list(_COLLECTED.get(self.token, []))

    def values(self) -> list[Any]:
        return [value for value, _ in self.timestamped()]


def run_pipeline(build: Callable[[beam.Pipeline], None]) -> PipelineResult:
    """Build a pipeline with ``build`` and run it to completion on FnApiRunner."""
    pipeline = beam.Pipeline(runner=FnApiRunner())
    build(pipeline)
    result = pipeline.run()
    result.wait_until_finish()
    return result


def counter(result: PipelineResult, name: str) -> int:
    """A ``beam_agents.io`` counter's committed value (0 if it never moved)."""
    found = result.metrics().query(MetricsFilter().with_namespace("beam_agents.io").with_name(name))
    return sum(metric.committed for metric in found["counters"])


def distribution(result: PipelineResult, name: str) -> Any:
    """A ``beam_agents.io`` distribution's committed value (count, sum, min, max)."""
    found = result.metrics().query(MetricsFilter().with_namespace("beam_agents.io").with_name(name))
    [metric] = found["distributions"]
    return metric.committed


def record_intent(key: bytes, note: str, *, seq: int = 0) -> ToolIntent:
    """An intent for the ``record`` test tool, which writes each execution to the ledger."""
    intent: ToolIntent = make_intent("record", {"note": note}, key=key, seq=seq)
    return intent


def started(rows: list[LedgerRow]) -> list[str]:
    """The intent ids whose execution started, in ledger order."""
    return [row.intent_id for row in rows if row.event == "started"]


def submit_all(
    intents: list[ToolIntent], transform: SubmitIntents
) -> tuple[list[SubmitAck], list[IntentDeadLetter], beam.runners.runner.PipelineResult]:
    """Run ``transform`` over ``intents``: its acks, its dead letters and the result."""
    acks, letters = Collector.new(), Collector.new()

    def build(pipeline: beam.Pipeline) -> None:
        outputs = pipeline | beam.Create(intents) | transform
        outputs.acks | "Acks" >> acks.sink()
        outputs.dead_letter | "DeadLetters" >> letters.sink()

    result = run_pipeline(build)
    return acks.values(), letters.values(), result
