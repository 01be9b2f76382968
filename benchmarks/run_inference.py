# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""Benchmark 3: ``RunAgent`` against Beam's own ``RunInference`` with a trivial model."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from apache_beam.ml.inference.base import KeyedModelHandler, ModelHandler, RunInference
from apache_beam.pvalue import PCollection

from beam_agents._protos import AgentEnvelope
from benchmarks.noop_activation import run_agent
from benchmarks.pipelines import Element, keyed_events, seconds_per_element, source_only
from benchmarks.report import BenchmarkResult, Figure

TITLE = "RunAgent vs RunInference with a trivial model"

DEFINITION = """\
The same 50,000 `(key, AgentEnvelope)` elements over 1,000 keys, the same runner
(`FnApiRunner`), the same method as benchmark 1 (wall time of the whole pipeline over the
element count, source included; after a warm-up run of each, the pipelines take turns, one run
each). Ours: `RunAgent` with the no-op agent. Floor: `RunInference(KeyedModelHandler(handler))`
where the handler is a `ModelHandler` subclass whose `load_model` returns nothing and whose
`run_inference` returns its inputs, with Beam's default batching. No target: this shows what
the per-key, stateful, per-element contract costs against Beam's stateless, batched inference
path, which keeps no per-key state at all."""

SIZE = (50_000, 1_000)
QUICK_SIZE = (2_000, 100)
ROUNDS = 1


class PassThroughHandler(ModelHandler[AgentEnvelope, AgentEnvelope, None]):
    """A trivial model: no model to load, every input is its own prediction."""

    def load_model(self) -> None:
        """Nothing to load."""

    def run_inference(
        self,
        batch: Sequence[AgentEnvelope],
        model: None,
        inference_args: dict[str, Any] | None = None,
    ) -> Iterable[AgentEnvelope]:
        """Return the inputs."""
        return batch


def run_inference(keyed: PCollection[Element]) -> None:
    """The floor stage."""
    keyed | "Inference" >> RunInference(KeyedModelHandler(PassThroughHandler()))


def run(quick: bool) -> BenchmarkResult:
    """Measure both pipelines on the same elements."""
    count, keys = QUICK_SIZE if quick else SIZE
    elements = keyed_events(count, keys)
    best = seconds_per_element(
        elements,
        {"source": source_only, "floor": run_inference, "ours": run_agent},
        rounds=1 if quick else ROUNDS,
    )
    source, floor, ours = (best[name] * 1e6 for name in ("source", "floor", "ours"))
    figure = Figure(
        name=f"per element, {keys:,} keys",
        unit="µs/element",
        ours=ours,
        samples=count,
        floor=floor,
        floor_label="RunInference, trivial model",
    )
    details = [
        f"The source alone costs {source:.1f} µs/element; net of it RunAgent costs "
        f"{ours - source:.1f} µs/element and RunInference {floor - source:.1f}."
    ]
    return BenchmarkResult(
        name="run_inference", title=TITLE, definition=DEFINITION, figures=[figure], details=details
    )
