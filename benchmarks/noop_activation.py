"""Per-element cost of a no-op agent through RunAgent, against its floor, in one run.

The floor is a bare stateful DoFn doing the state reads and writes a no-op activation does
(read the key header and the continuation, write the header), on the same runner
(FnApiRunner), with the same input. Both pipelines read the same pre-built elements, and the
cost of that source alone is measured too, so the overhead can be read with or without it.

    python benchmarks/noop_activation.py            # 100,000 elements over 1,000 and 10,000 keys
    python benchmarks/noop_activation.py --quick    # a tiny smoke run
    python benchmarks/noop_activation.py --profile  # cProfile the RunAgent pipeline too

Target: RunAgent at most 2x the floor (stretch: 1.5x).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Callable
from typing import Any

import apache_beam as beam
from apache_beam.coders import BytesCoder
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec

from beam_agents import AgentConfig, RunAgent
from beam_agents._protos import AgentEnvelope, KeyHeader
from beam_agents.core.agent import Complete
from beam_agents.core.context import ActivationContext

Element = tuple[bytes, AgentEnvelope]


async def noop_agent(ctx: ActivationContext) -> Complete:
    return Complete()


HEADER = ReadModifyWriteStateSpec("header", BytesCoder())
CONTINUATION = ReadModifyWriteStateSpec("continuation", BytesCoder())
HEADER_STATE = beam.DoFn.StateParam(HEADER)
CONTINUATION_STATE = beam.DoFn.StateParam(CONTINUATION)


class FloorDoFn(beam.DoFn):  # type: ignore[misc]
    """The same state traffic as a no-op activation, and nothing else."""

    def process(
        self,
        element: Element,
        header: Any = HEADER_STATE,
        continuation: Any = CONTINUATION_STATE,
    ) -> None:
        blob = header.read()
        continuation.read()
        state = KeyHeader.FromString(blob) if blob else KeyHeader()
        header.write(
            KeyHeader(
                next_seq=state.next_seq + 1, last_activity_ms=element[1].event_time_ms
            ).SerializeToString()
        )


def make_elements(count: int, keys: int) -> list[Element]:
    elements = []
    for index in range(count):
        key = b"key-%d" % (index % keys)
        envelope = AgentEnvelope(entity_key=key, event_time_ms=1_000 + index, external_event=b"e")
        elements.append((key, envelope))
    return elements


def time_pipeline(elements: list[Element], stage: Callable[[beam.PCollection], Any]) -> float:
    """Seconds per element for reading ``elements`` and applying ``stage``."""
    started = time.perf_counter()
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        keyed = pipeline | beam.Create(elements).with_output_types(tuple[bytes, AgentEnvelope])
        stage(keyed)
    return (time.perf_counter() - started) / len(elements)


def source_only(keyed: beam.PCollection) -> None:
    keyed | "Count" >> beam.combiners.Count.Globally()


def floor(keyed: beam.PCollection) -> None:
    keyed | "Floor" >> beam.ParDo(FloorDoFn())


def run_agent(keyed: beam.PCollection) -> None:
    keyed | "Agent" >> RunAgent(noop_agent, config=AgentConfig())


def measure(count: int, keys: int, profile: bool) -> None:
    elements = make_elements(count, keys)
    results = {}
    for name, stage in (("source", source_only), ("floor", floor), ("run_agent", run_agent)):
        results[name] = time_pipeline(elements, stage) * 1e6
    source, bare, agent = results["source"], results["floor"], results["run_agent"]
    print(f"{count:,} elements over {keys:,} keys (FnApiRunner)")
    print(f"  source only:            {source:7.1f} us/element")
    print(f"  floor (bare stateful):  {bare:7.1f} us/element")
    print(f"  RunAgent (no-op agent): {agent:7.1f} us/element")
    print(f"  ratio RunAgent/floor:   {agent / bare:7.2f}x")
    if bare > source:
        print(f"  ratio net of source:    {(agent - source) / (bare - source):7.2f}x")
    if profile:
        profiler = cProfile.Profile()
        profiler.runcall(time_pipeline, elements, run_agent)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run")
    parser.add_argument("--profile", action="store_true", help="cProfile the RunAgent run")
    options = parser.parse_args()
    if options.quick:
        measure(2_000, 100, options.profile)
        return
    measure(100_000, 1_000, options.profile)
    measure(100_000, 10_000, options.profile)


if __name__ == "__main__":
    main()
