# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""Pipeline benchmarks on ``FnApiRunner``: RunAgent against a Beam floor on the same input.

Each figure is the wall time of a whole pipeline ``Create(elements) | stage`` over its element
count. After a warm-up run of each stage the stages take turns, and each stage's best round counts.
Where valgrind is installed, the activations' figures also count instructions under cachegrind.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib.machinery
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.coders import BytesCoder
from apache_beam.ml.inference.base import KeyedModelHandler, ModelHandler, RunInference
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.pvalue import PCollection
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec

from beam_agents import (
    ActivationContext,
    AgentConfig,
    AgentEnvelope,
    Budget,
    Complete,
    LlmRequest,
    RunAgent,
    ToolRegistry,
    WriteRecords,
    tool,
)
from beam_agents._protos import KeyHeader, ToolIntent
from beam_agents.core import activation
from beam_agents.model.fake import (
    FakeLLM,
    match_any,
    match_contains,
    respond_with,
    simulate_latency,
)
from beam_agents.replay.backtest import run_backtest
from benchmarks.harness import (
    COMPILED_TREE,
    EFFECTOR_READY,
    effector_command,
    instructions_per_element,
    percentile,
    seconds_per_call,
    servers,
)
from benchmarks.report import Figure, Goal, Result, Target
from effector.launch import child_environment

Element = tuple[bytes, AgentEnvelope]
Stage = Callable[["PCollection[Element]"], object]

WARM_UP_ELEMENTS = 200


def keyed_events(
    count: int, keys: int, payload: bytes = b"e", prefix: bytes = b"key"
) -> list[Element]:
    """``count`` external events spread round-robin over ``keys`` keys, in event-time order."""
    elements = []
    for index in range(count):
        key = b"%s-%d" % (prefix, index % keys)
        envelope = AgentEnvelope(
            entity_key=key, event_time_ms=1_000 + index, external_event=payload
        )
        elements.append((key, envelope))
    return elements


def run_pipeline(elements: list[Element], stage: Stage) -> None:
    """Run ``Create(elements) | stage`` to completion on a fresh ``FnApiRunner``."""
    with beam.Pipeline(runner=FnApiRunner(), options=PipelineOptions(flags=[])) as p:
        stage(p | "Events" >> beam.Create(elements).with_output_types(Element))


def us_per_element(
    elements: list[Element], stages: Mapping[str, Stage], *, rounds: int = 1
) -> dict[str, float]:
    """The best µs per element of ``Create(elements) | stage``, for each stage by name."""
    for stage in stages.values():
        run_pipeline(elements[:WARM_UP_ELEMENTS], stage)
    best = dict.fromkeys(stages, float("inf"))
    for _ in range(rounds):
        for name, stage in stages.items():
            seconds = seconds_per_call(functools.partial(run_pipeline, elements, stage))
            best[name] = min(best[name], seconds * 1e6 / len(elements))
    return best


class _Discard(beam.DoFn):
    def process(self, element: object) -> None:
        """Drop the element."""


HEADER_STATE: Any = beam.DoFn.StateParam(ReadModifyWriteStateSpec("header", BytesCoder()))
MEMORY_STATE: Any = beam.DoFn.StateParam(ReadModifyWriteStateSpec("memory", BytesCoder()))


def advance_header(header: Any, event_time_ms: int) -> int:
    """A no-op activation's state traffic: read the header cell, write it back advanced."""
    blob = header.read()
    state = KeyHeader.FromString(blob) if blob else KeyHeader()
    header.write(
        KeyHeader(next_seq=state.next_seq + 1, last_activity_ms=event_time_ms).SerializeToString()
    )
    return state.next_seq


def memory_value(seq: int, size: int) -> bytes:
    """A ``size``-byte value that differs from the previous activation's (so it is written)."""
    return seq.to_bytes(8, "little") + bytes(size - 8)


class BareStatefulDoFn(beam.DoFn):
    """The no-op floor: per element, exactly a no-op activation's state traffic."""

    def process(self, element: Element, header: Any = HEADER_STATE) -> None:
        advance_header(header, element[1].event_time_ms)


class BareMemoryDoFn(beam.DoFn):
    """The memory floor: the no-op traffic plus reading the memory cell and writing a value."""

    def __init__(self, memory_bytes: int) -> None:
        super().__init__()
        self._memory_bytes = memory_bytes

    def process(
        self, element: Element, header: Any = HEADER_STATE, memory: Any = MEMORY_STATE
    ) -> None:
        seq = advance_header(header, element[1].event_time_ms)
        memory.read()
        memory.write(memory_value(seq, self._memory_bytes))


def bare_stateful(keyed: PCollection[Element]) -> None:
    """The no-op floor stage."""
    keyed | "Floor" >> beam.ParDo(BareStatefulDoFn())


def memory_floor(memory_bytes: int) -> Stage:
    """The floor stage writing ``memory_bytes`` of memory per element."""

    def stage(keyed: PCollection[Element]) -> None:
        keyed | "Floor" >> beam.ParDo(BareMemoryDoFn(memory_bytes))

    return stage


def agent_stage(agent: Callable[..., Any], config: AgentConfig) -> Stage:
    """``RunAgent(agent, config=config)`` as a stage."""

    def stage(keyed: PCollection[Element]) -> None:
        keyed | "Agent" >> RunAgent(agent, config=config)

    return stage


# -- no-op and model-call activations --------------------------------------------------------


async def noop_agent(ctx: ActivationContext) -> Complete:
    """Finish at once: what remains is the runtime's own cost per activation."""
    return Complete()


REPLY = b"an answer"


def instant_model() -> FakeLLM:
    """A model that answers :data:`REPLY` at once."""
    return FakeLLM([(match_any(), respond_with(REPLY))])


async def model_call_agent(ctx: ActivationContext) -> Complete:
    """Ask the model about the event, keep the answer in one memory slot, complete."""
    reply = await ctx.call_model(LlmRequest("bench", ctx.event.decode()))
    ctx.memory.set("reply", ctx.seq.to_bytes(8, "little") + reply.response)
    return Complete()


MODEL_MEMORY_BYTES = 30
"""About the size of the memory cell the model-call agent's commit writes."""


def activation_stages() -> dict[str, Stage]:
    """The no-op and model-call activations and their floors, by name."""
    return {
        "floor": bare_stateful,
        "ours": agent_stage(noop_agent, AgentConfig()),
        "model floor": memory_floor(MODEL_MEMORY_BYTES),
        "model": agent_stage(model_call_agent, AgentConfig(provider_factory=instant_model)),
    }


ACTIVATIONS = (
    ("no-op activation", "ours", "floor"),
    ("model-call activation", "model", "model floor"),
)
"""Each activation figure's name, its stage and its floor's."""


def activation_target(stage: str, keys: int) -> Target:
    """The no-op activation within 1.2x its floor; the model call 1.6x, 1.4x from 10,000 keys."""
    bound = 1.2 if stage == "ours" else 1.4 if keys >= 10_000 else 1.6
    return Target(Goal.RATIO_AT_MOST, bound)


def run_activation_stage(name: str, count: int, keys: int) -> None:
    """Run activation stage ``name`` over ``count`` events on ``keys`` keys."""
    run_pipeline(keyed_events(count, keys), activation_stages()[name])


def activation_command(name: str, count: int, *, keys: int) -> list[str]:
    """A command line running :func:`run_activation_stage` in a fresh interpreter."""
    code = "import sys; from benchmarks.pipelines import run_activation_stage as run; "
    code += "run(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))"
    return [sys.executable, "-c", code, name, str(count), str(keys)]


INSTRUCTION_KEYS, INSTRUCTION_COUNT, INSTRUCTION_EXTRA = 1_000, 2_000, 8_000
"""Instructions per element are counted over N and N + k events on the same keys; k is large
since a run's fixed count varies by 10-20 million between runs."""
INSTRUCTIONS_METHOD = (
    f"\nIr: cachegrind's count over {INSTRUCTION_COUNT + INSTRUCTION_EXTRA:,} events less over "
    f"{INSTRUCTION_COUNT:,}, per added event, {INSTRUCTION_KEYS:,} keys."
)


COMPILED_SUFFIX = ", compiled core"


def core_is_compiled() -> bool:
    """Whether this process runs the mypyc build of the runtime core."""
    return isinstance(activation.__loader__, importlib.machinery.ExtensionFileLoader)


def compiled_activations(
    tree: Path, quick: bool, benchmark: str = "noop_activation"
) -> list[Figure]:
    """``benchmark``'s figures measured in ``tree``'s compiled core, in an interpreter there."""
    with tempfile.TemporaryDirectory(prefix="beam-agents-bench-") as scratch:
        output = Path(scratch) / "compiled.json"
        command = [sys.executable, "-m", "benchmarks", "--run-one", benchmark]
        command += ["--json", str(output), *(["--quick"] if quick else [])]
        environment = child_environment(tree)
        environment.pop(COMPILED_TREE)
        run = subprocess.run(command, cwd=tree, env=environment, capture_output=True, text=True)
        if run.returncode != 0:
            lines = run.stderr.strip().splitlines()
            raise RuntimeError(f"the compiled core's run failed: {lines[-1] if lines else ''}")
        figures = Result.from_json(output.read_text()).figures
    if not all(figure.name.endswith(COMPILED_SUFFIX) for figure in figures):
        raise RuntimeError(f"{tree} does not hold a compiled core: run `make compiled`")
    return figures


COMPILED_METHOD = (
    "\nCompiled core: the same, in a copy whose core mypyc compiled (`make compiled`)."
)


def noop_activation(quick: bool) -> Result:
    """No-op and model-call activations against bare stateful DoFns with their state traffic;
    beside the times, instructions per element under cachegrind where valgrind is installed."""
    sizes = [(2_000, 100)] if quick else [(100_000, 1_000), (100_000, 10_000)]
    stages = activation_stages()
    measured = []
    for count, keys in sizes:
        activations = ACTIVATIONS if keys == sizes[0][1] else ACTIVATIONS[1:]
        names = [name for _, ours, floor in activations for name in (floor, ours)]
        us = us_per_element(keyed_events(count, keys), {name: stages[name] for name in names})
        measured += [(label, ours, floor, keys, us) for label, ours, floor in activations]
    ir = None
    if not quick:
        ir = instructions_per_element(
            functools.partial(activation_command, keys=INSTRUCTION_KEYS),
            stages,
            INSTRUCTION_COUNT,
            INSTRUCTION_EXTRA,
        )
    figures = []
    build = COMPILED_SUFFIX if core_is_compiled() else ""
    for label, ours, floor, keys, us in measured:
        name, target = f"{label}, {keys:,} keys", activation_target(ours, keys)
        figures.append(Figure(name + build, "µs/element", us[ours], us[floor], target))
        if ir is not None and keys == INSTRUCTION_KEYS:
            counted = f"{name}, instructions{build}"
            figures.append(Figure(counted, "Ir/element", ir[ours], ir[floor], target))
    tree = os.environ.get(COMPILED_TREE)
    if tree:
        figures += compiled_activations(Path(tree), quick)
    return Result(
        "noop_activation",
        "No-op and model-call activations against a bare stateful DoFn",
        """\
100,000 events round-robin over 1,000 keys (and 10,000 for the model call), one round.
No-op: the agent returns `Complete()`; floor: a DoFn reading and writing the header cell.
Model call: one `ctx.call_model` on an instant `FakeLLM`, one memory slot written;
floor: a DoFn reading and writing the header and a memory cell of the same size."""
        + ("" if ir is None else INSTRUCTIONS_METHOD)
        + ("" if not tree else COMPILED_METHOD),
        figures,
    )


# -- a fleet budget on the model call ----------------------------------------------------------

CALL_TOKENS = len(REPLY.split())
"""The tokens one call of :func:`instant_model` spends: ``FakeLLM`` counts a plain body's words
as output tokens."""
LEASES_PER_RUN = 5
"""The cap is set so that a timed run leases this many chunks (a chunk is a fiftieth of it)."""
BUDGET_TARGET = Target(Goal.RATIO_AT_MOST, 1.1)


class CountIntents(beam.DoFn):
    """Consumes ``.intents`` (both stages alike), counting them in this process (``seen``)."""

    seen = 0

    def process(self, intent: ToolIntent) -> None:
        """Count the intent."""
        CountIntents.seen += 1


def counted_stage(config: AgentConfig) -> Stage:
    """The model-call agent under ``config``, its ``.intents`` counted."""

    def stage(keyed: PCollection[Element]) -> None:
        outputs = keyed | "Agent" >> RunAgent(model_call_agent, config=config)
        outputs.intents | "Intents" >> beam.ParDo(CountIntents())

    return stage


def fleet_budget(effector: str, count: int) -> Budget:
    """A token budget on ``effector`` whose default chunk is a timed run's tokens over
    :data:`LEASES_PER_RUN`: its cap is 50 chunks, ten runs' tokens, so the benchmark's few runs
    never reach it (their debits are not delivered: what they spent is held until leases lapse)."""
    return Budget("bench", effector, tokens=50 * count * CALL_TOKENS // LEASES_PER_RUN)


def alternating_us(
    count: int, keys: int, stages: Mapping[str, tuple[Stage, int]], rounds: int
) -> dict[str, float]:
    """The best µs per element of each stage over ``count`` events on ``keys`` keys, in
    ``rounds`` rounds taking turns (the order reversed every other round) after a warm-up.

    Each run has keys of its own, so no call is one the process's budget leases saw before
    (they remember the calls they admitted lately); each stage must emit its number of intents
    per event on ``.intents``.
    """
    best = dict.fromkeys(stages, float("inf"))
    runs = 0
    for index in range(rounds + 1):  # the first is the warm-up
        size = count if index else WARM_UP_ELEMENTS
        for name in list(stages)[:: -1 if index % 2 else 1]:
            stage, intents_per_event = stages[name]
            elements = keyed_events(size, keys, prefix=b"k%03d" % runs)
            runs += 1
            CountIntents.seen = 0
            seconds = seconds_per_call(functools.partial(run_pipeline, elements, stage))
            if CountIntents.seen != intents_per_event * size:
                raise RuntimeError(f"{name}: {CountIntents.seen} intents over {size} events")
            if index:
                best[name] = min(best[name], seconds * 1e6 / size)
    return best


def leases_taken(database: Path) -> int:
    """How many leases the effector on SQLite file ``database`` granted."""
    connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        (leases,) = connection.execute("SELECT COUNT(*) FROM effector_budget_leases").fetchone()
    finally:
        connection.close()
    return int(leases)


def budget_overhead(quick: bool) -> Result:
    """The model-call activation with a fleet budget against the same without one."""
    count, keys, rounds = (2_000, 100, 1) if quick else (100_000, 1_000, 3)
    with tempfile.TemporaryDirectory(prefix="beam-agents-bench-") as scratch_dir:
        scratch = Path(scratch_dir)
        command = effector_command(f"sqlite:///{scratch / 'e.db'}")
        with servers([command], EFFECTOR_READY, scratch) as (target,):
            budget = fleet_budget(target, count)
            plain = AgentConfig(provider_factory=instant_model)
            stages = {
                "plain": (counted_stage(plain), 0),
                "budget": (counted_stage(dataclasses.replace(plain, budget=budget)), 1),
            }
            us = alternating_us(count, keys, stages, rounds)
        leases = leases_taken(scratch / "e.db")
    if leases < rounds * LEASES_PER_RUN:
        raise RuntimeError(f"{leases} leases over {rounds} timed runs: the budget was not leased")
    build = COMPILED_SUFFIX if core_is_compiled() else ""
    name = f"model-call activation with a fleet budget, {keys:,} keys{build}"
    figures = [Figure(name, "µs/element", us["budget"], us["plain"], BUDGET_TARGET)]
    tree = os.environ.get(COMPILED_TREE)
    if tree:
        figures += compiled_activations(Path(tree), quick, "budget_overhead")
    return Result(
        "budget_overhead",
        "A model-call activation with a fleet budget against the same without one",
        f"""\
The model-call activation of noop_activation, 100,000 events over 1,000 keys, `.intents` counted
(checked: one debit per event with the budget, none without); best of 3 rounds taking turns.
Budget: `AgentConfig(budget=Budget(tokens=...))` on an effector subprocess on SQLite; its default
chunk (a fiftieth of the cap) is a run's tokens over {LEASES_PER_RUN}; the cap is never reached."""
        + ("" if not tree else COMPILED_METHOD),
        figures,
    )


# -- RunInference ------------------------------------------------------------------------------


class PassThroughHandler(ModelHandler[AgentEnvelope, AgentEnvelope, None]):
    """A trivial model: nothing to load, every input is its own prediction."""

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


def _inference(keyed: PCollection[Element]) -> None:
    keyed | "Inference" >> RunInference(KeyedModelHandler(PassThroughHandler()))


def run_inference(quick: bool) -> Result:
    """The no-op RunAgent against Beam's RunInference with a trivial model."""
    count, keys = (2_000, 100) if quick else (50_000, 1_000)
    stages = {"floor": _inference, "ours": agent_stage(noop_agent, AgentConfig())}
    us = us_per_element(keyed_events(count, keys), stages)
    return Result(
        "run_inference",
        "RunAgent against RunInference with a trivial model",
        """\
50,000 events over 1,000 keys; ours: RunAgent with the no-op agent.
Floor: `RunInference(KeyedModelHandler(...))` whose model returns its inputs.
No target: it shows what the keyed, stateful contract costs over stateless inference.""",
        [Figure(f"per element, {keys:,} keys", "µs/element", us["ours"], us["floor"])],
    )


# -- state commit against memory size ---------------------------------------------------------


async def rewrite_memory(ctx: ActivationContext) -> Complete:
    """Set the slot ``blob`` to a fresh value of the size the event names."""
    ctx.memory.set("blob", memory_value(ctx.seq, int(ctx.event)))
    return Complete()


def state_commit(quick: bool) -> Result:
    """Activations rewriting S bytes of memory against a DoFn writing S bytes of state."""
    sizes = (
        [(1 << 10, 200), (1 << 16, 200)]
        if quick
        else [(1 << 10, 8_000), (1 << 16, 8_000), (1 << 18, 4_000)]
    )
    figures = []
    for size, count in sizes:
        elements = keyed_events(count, 10, payload=b"%d" % size)
        stages = {"floor": memory_floor(size), "ours": agent_stage(rewrite_memory, AgentConfig())}
        us = us_per_element(elements, stages, rounds=1 if quick else 3)
        target = Target(Goal.RATIO_AT_MOST, 2.0) if size >= 1 << 16 else None
        name = f"state commit, memory value of {size >> 10} KiB, per element"
        figures.append(Figure(name, "µs/element", us["ours"], us["floor"], target))
    return Result(
        "state_commit",
        "State commit cost against working-memory size",
        """\
Over 10 keys, each activation sets one slot to a fresh value of S bytes and completes.
Floor: a DoFn doing the no-op traffic and writing a fresh S-byte memory cell.
Best of 3 rounds taking turns; 8,000 events (4,000 at 256 KiB).""",
        figures,
    )


# -- replay and backtest ----------------------------------------------------------------------


@tool
def band(key: str) -> str:
    """The key's risk band.

    Args:
        key: the key.
    """
    return "high" if key.endswith("7") else "low"


def screening_model() -> FakeLLM:
    """A model flagging high-risk keys."""
    return FakeLLM(
        [(match_contains("risk=high"), respond_with(b"flag")), (match_any(), respond_with(b"ok"))]
    )


def screen_config(record: bool = True) -> AgentConfig:
    """The screening agent's config (recording unless told otherwise)."""
    return AgentConfig(
        provider_factory=screening_model, tool_registry=ToolRegistry([band]), record=record
    )


async def screen(ctx: ActivationContext) -> Complete:
    """A memory ring, a tool, a model call and, when flagged, an intent."""
    ctx.memory.append("seen", ctx.event, max_items=4)
    risk = await ctx.run_tool("band", {"key": ctx.entity_key.decode()})
    reply = await ctx.call_model(LlmRequest("bench-1", f"event {ctx.seq} risk={risk}"))
    if reply.text == "flag":
        ctx.act("noop", {"seq": ctx.seq})
    return Complete(reply.response)


def _recorded(keyed: PCollection[Element]) -> None:
    outputs = keyed | "Agent" >> RunAgent(screen, config=screen_config())
    outputs.records | "Discard" >> beam.ParDo(_Discard())


def _writing(directory: str, keyed: PCollection[Element]) -> None:
    outputs = keyed | "Agent" >> RunAgent(screen, config=screen_config())
    outputs.records | "Records" >> WriteRecords(directory)


def replay_backtest(quick: bool) -> Result:
    """Backtest throughput and the cost of recording, against RunAgent without recording."""
    count, keys, rounds = (400, 40, 1) if quick else (10_000, 500, 2)
    elements = keyed_events(count, keys)
    stages = {"plain": agent_stage(screen, screen_config(record=False)), "recorded": _recorded}
    with tempfile.TemporaryDirectory(prefix="beam-agents-bench-") as scratch:
        records = str(Path(scratch) / "records")
        run_pipeline(elements, functools.partial(_writing, records))
        live = us_per_element(elements, stages, rounds=rounds)
        backtest = float("inf")
        for round_number in range(rounds + 1):  # the first is the warm-up
            backtest_once = functools.partial(
                run_backtest,
                [records],
                f"{__name__}:screen",
                f"{__name__}:screen_config",
                out=str(Path(scratch) / f"report-{round_number}"),
            )
            seconds = seconds_per_call(backtest_once)
            if round_number:
                backtest = min(backtest, seconds * 1e6 / count)
    return Result(
        "replay_backtest",
        "Replay and backtest",
        """\
An agent with a memory ring, one tool, one `FakeLLM` call and sometimes an intent;
10,000 events over 500 keys. Floor of both: the same RunAgent without recording.
Backtest: `run_backtest` over the recorded files, per activation, best of 2 rounds.
Recording: `AgentConfig(record=True)` with `.records` discarded, per event.""",
        [
            Figure(
                f"backtest, {count:,} recorded activations on {keys:,} keys, per activation",
                "µs",
                backtest,
                live["plain"],
                Target(Goal.RATIO_AT_MOST, 1.5),
            ),
            Figure(
                "live run with recording, per event",
                "µs",
                live["recorded"],
                live["plain"],
                Target(Goal.RATIO_AT_MOST, 1.2),
            ),
        ],
    )


# -- overhead on top of the model's latency -----------------------------------------------------

KEYS_PER_PIPELINE = 10


@dataclass
class _Run:
    """What the stage and the output stamp of this process's one pipeline share."""

    barrier: Any
    phase_s: float
    samples: list[float] = field(default_factory=list)
    """Seconds between consecutive outputs, for activations on keys already loaded."""
    started: bool = False
    keys_seen: set[bytes] = field(default_factory=set)
    new_key: bool = False


_current: _Run | None = None
"""Set in each pipeline process before its pipeline runs."""


def _start_together(key: bytes) -> None:
    """On the first element, wait for every pipeline, then for this one's phase; note new keys."""
    run = _current
    assert run is not None
    if not run.started:
        run.started = True
        run.barrier.wait(timeout=60)
        time.sleep(run.phase_s)
    run.new_key = key not in run.keys_seen
    run.keys_seen.add(key)


async def model_agent(ctx: ActivationContext) -> Complete:
    """One model call, then complete with an output."""
    _start_together(ctx.entity_key)
    await ctx.call_model(LlmRequest("bench", ctx.event.decode()))
    return Complete(output=b"done")


class WaitingFloorDoFn(beam.DoFn):
    """The floor: the no-op state traffic, waiting out L on its own event loop, one output."""

    def __init__(self, latency_ms: int) -> None:
        super().__init__()
        self._latency_ms = latency_ms

    def setup(self) -> None:
        self._loop = asyncio.new_event_loop()

    def teardown(self) -> None:
        self._loop.close()

    def process(self, element: Element, header: Any = HEADER_STATE) -> list[bytes]:
        _start_together(element[0])
        advance_header(header, element[1].event_time_ms)
        self._loop.run_until_complete(simulate_latency(self._latency_ms))
        return [b"done"]


class StampOutputs(beam.DoFn):
    """Notes the time between consecutive outputs of a bundle (fused after the stage)."""

    def start_bundle(self) -> None:
        self._previous: float | None = None

    def process(self, output: bytes) -> None:
        now = time.perf_counter()
        assert _current is not None
        if self._previous is not None and not _current.new_key:
            _current.samples.append(now - self._previous)
        self._previous = now


def _latency_pipeline(index: int, count: int, latency_ms: int, floor: bool) -> None:
    def stage(keyed: PCollection[Element]) -> None:
        if floor:
            outputs = keyed | "Floor" >> beam.ParDo(WaitingFloorDoFn(latency_ms))
        else:
            model = functools.partial(latency_model, latency_ms)
            config = AgentConfig(provider_factory=model)
            outputs = (keyed | "Agent" >> RunAgent(model_agent, config=config)).output
        outputs | "Stamp" >> beam.ParDo(StampOutputs())

    run_pipeline(keyed_events(count, KEYS_PER_PIPELINE, b"question", b"p%d" % index), stage)


def latency_model(latency_ms: int) -> FakeLLM:
    """A model that answers after ``latency_ms``."""
    return FakeLLM([(match_any(), respond_with(REPLY, latency_ms=latency_ms))])


def _pipeline_process(
    index: int, count: int, latency_ms: int, floor: bool, barrier: Any, phase_s: float, out: Any
) -> None:
    """One pipeline of a tier, in its own process; sends back its samples or its failure."""
    global _current
    _current = _Run(barrier=barrier, phase_s=phase_s)
    try:
        _latency_pipeline(index, count, latency_ms, floor)
    except BaseException:
        barrier.abort()
        out.send(traceback.format_exc())
        raise
    out.send(_current.samples)


def measure_tier(
    latency_ms: int, pipelines: int, samples: int, sides: Sequence[bool]
) -> dict[bool, list[float]]:
    """``pipelines`` pipelines per side (``True``: the floor), each in a process of its own,
    started together and staggered over one latency period; the samples by side."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    count = -(-samples // pipelines) + KEYS_PER_PIPELINE
    barrier = context.Barrier(pipelines * len(sides))
    stagger_s = latency_ms / 1000 / (pipelines * len(sides))
    running = []
    for index in range(pipelines):
        for slot, floor in enumerate(sides, start=index * len(sides)):
            receiver, sender = context.Pipe(duplex=False)
            arguments = (index, count, latency_ms, floor, barrier, slot * stagger_s, sender)
            process = context.Process(target=_pipeline_process, args=arguments)
            process.start()
            sender.close()
            running.append((floor, process, receiver))
    collected: dict[bool, list[float]] = {floor: [] for floor in sides}
    for floor, process, receiver in running:
        try:
            outcome = receiver.recv()
        except EOFError:
            outcome = "exited before reporting"
        process.join()
        if isinstance(outcome, str):
            raise RuntimeError(f"a pipeline failed: {outcome}")
        collected[floor].extend(outcome)
    return collected


def overhead_tiers(quick: bool) -> Result:
    """Activation time less the model's latency L, at two latencies, against a waiting DoFn."""
    samples, tiers = (8, ((5, 2), (50, 4))) if quick else (400, ((50, 4), (500, 25)))
    figures: list[Figure] = []
    p50: dict[int, tuple[float, float]] = {}
    for latency_ms, pipelines in tiers:
        if pipelines > 4:  # 50 processes waking together would load the machine: take turns
            measured = {
                floor: measure_tier(latency_ms, pipelines, samples, (floor,))[floor]
                for floor in (True, False)
            }
        else:
            measured = measure_tier(latency_ms, pipelines, samples, (True, False))
        ms = {floor: [(s * 1e3 - latency_ms) for s in values] for floor, values in measured.items()}
        for label, fraction, bound in (("p50", 0.5, 1.0), ("p99", 0.99, 3.0)):
            ours, floor = percentile(ms[False], fraction), percentile(ms[True], fraction)
            name = f"activation overhead {label}, L = {latency_ms} ms ({pipelines} pipelines)"
            figures.append(Figure(name, "ms", ours, floor, Target(Goal.BELOW, bound)))
            p50.setdefault(latency_ms, (ours, floor))
    (low, _), (high, _) = tiers
    growth, floor_growth = (p50[high][side] / p50[low][side] for side in (0, 1))
    name = f"overhead growth, p50 at {high} ms over p50 at {low} ms"
    figures.append(Figure(name, "x", growth, floor_growth, Target(Goal.RATIO_AT_MOST, 1.25)))
    return Result(
        "overhead_tiers",
        "Overhead tiers: activation wall time minus the model's latency",
        """\
One model call to a `FakeLLM` answering after L, then an output; overhead = the time between
consecutive outputs less L, on keys already loaded in the bundle, at least 400 activations.
Floor: a DoFn doing the no-op state traffic and waiting L on its own event loop.
K pipelines per side in processes of their own (4 at 50 ms, alongside the floor's; 25 at
500 ms, after the floor's), 10 keys each, started together and staggered over L.""",
        figures,
    )
