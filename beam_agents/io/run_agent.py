# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""``RunAgent``: run an agent over a keyed stream of envelopes, as one Beam transform.

Its stateful :class:`AgentDoFn` loads a key's state lazily, asks the ``Activator`` for a plan
and applies it: it decides nothing.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.coders import BytesCoder
from apache_beam.metrics.metric import Metrics
from apache_beam.pipeline import AppliedPTransform, PipelineVisitor
from apache_beam.pvalue import PCollection, TaggedOutput
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms.timeutil import TimeDomain
from apache_beam.transforms.userstate import (
    BagStateSpec,
    TimerSpec,
    on_timer,
)
from apache_beam.transforms.window import GlobalWindow, GlobalWindows
from apache_beam.typehints import typehints
from apache_beam.utils.timestamp import MIN_TIMESTAMP, Timestamp

from beam_agents._protos import ActivationRecord, AgentEnvelope, AgentError, ToolIntent, TraceEvent
from beam_agents.core.activation import Activator, Plan, TimerFired, element_problem
from beam_agents.core.agent import CoroutineDriver, epoch_clock, is_agent
from beam_agents.core.config import TRIGGER_DEADLINE, TRIGGER_IDLE, AgentConfig
from beam_agents.core.context import AgentFn
from beam_agents.core.model_calls import (
    METRICS_NAMESPACE,
    MODEL_COUNTERS,
    ModelGateway,
    answer_memo,
)
from beam_agents.core.observability import ErrorLog, progress_line
from beam_agents.core.staging import activation_services
from beam_agents.core.state import KeyState
from beam_agents.io.budget_leases import BudgetSet, as_connection
from beam_agents.model.resilience import CircuitBreakers
from beam_agents.tools import ToolConnection, ToolRunner

__all__ = ["RunAgent", "RunAgentOutputs"]


OUTPUT_TAG = "output"
INTENTS_TAG = "intents"
TRACES_TAG = "traces"
ERRORS_TAG = "errors"
RECORDS_TAG = "records"


# -- the transform ---------------------------------------------------------------------------
class RunAgentOutputs(NamedTuple):
    """What ``RunAgent`` returns.

    ``output``: the bytes of every non-empty ``Complete`` (and ``Deny``). ``intents``: the
    committed ``ToolIntent``s, for the effector. ``traces``: ``TraceEvent``s. ``errors``:
    ``AgentError`` dead letters with the original envelope, each also logged (rate-limited).
    ``records``: one ``ActivationRecord`` per commit with ``AgentConfig(record=True)``.
    """

    output: PCollection[bytes]
    intents: PCollection[ToolIntent]
    traces: PCollection[TraceEvent]
    errors: PCollection[AgentError]
    records: PCollection[ActivationRecord]


_ENVELOPE_PAIR = typehints.Tuple[bytes, AgentEnvelope]


def _needs_admission(element_type: Any) -> bool:
    """Whether elements must be checked before the keyed step; ``ValueError`` if none could pass."""
    if element_type is None or element_type == typehints.Any:
        return True
    if isinstance(element_type, typehints.UnionConstraint):
        refusals: list[ValueError] = []
        for member in element_type.union_types:
            try:
                _needs_admission(member)
            except ValueError as refusal:
                refusals.append(refusal)
            else:
                return True
        raise refusals[0]
    if not (
        isinstance(element_type, typehints.TupleConstraint) and len(element_type.tuple_types) == 2
    ):
        raise ValueError(
            f"RunAgent expects a PCollection of (bytes, AgentEnvelope) pairs, got elements of "
            f"type {element_type}; key the envelopes first, e.g. `| beam.WithKeys(lambda e: "
            "e.entity_key).with_output_types(tuple[bytes, AgentEnvelope])`"
        )
    key_type, value_type = element_type.tuple_types
    if key_type not in (bytes, typehints.Any):
        raise ValueError(
            f"RunAgent keys must be bytes, got {key_type}; encode them, e.g. "
            "`| beam.MapTuple(lambda k, e: (k.encode(), e))`"
        )
    if value_type not in (AgentEnvelope, typehints.Any):
        raise ValueError(
            f"RunAgent values must be AgentEnvelope messages, got {value_type}; wrap each "
            "payload in AgentEnvelope(entity_key=..., event_time_ms=..., external_event=...) "
            "(`from beam_agents import AgentEnvelope`)"
        )
    return key_type is not bytes or value_type is not AgentEnvelope


def _ticks(runner: object) -> bool:
    """Whether deadlines tick (checked again every bundle until due): on the ``FnApiRunner``."""
    return isinstance(runner, FnApiRunner)


def _upstream(pcoll: PCollection[Any], matches: Callable[[Any], bool]) -> bool:
    """Whether a transform upstream of ``pcoll`` ``matches``."""
    seen: set[int] = set()
    producers = [pcoll.producer]
    while producers:
        applied = producers.pop()
        if applied is None or id(applied) in seen:
            continue
        seen.add(id(applied))
        if matches(applied.transform):
            return True
        producers.extend(upstream.producer for upstream in applied.main_inputs.values())
        producers.extend(applied.parts)
    return False


def _fed_by_test_stream(pcoll: PCollection[Any]) -> bool:
    """Whether a ``TestStream`` is upstream of ``pcoll`` (its runner then keeps a test clock)."""
    return _upstream(pcoll, lambda transform: isinstance(transform, TestStream))


def _unbounded_read(transform: Any) -> bool:
    """Whether ``transform`` reads without end (a DoFn doing unbounded work per element).

    ``ReadEnvelopes`` is one, although Beam counts its output as bounded.
    """
    fn = getattr(transform, "fn", None)
    process = getattr(fn, "process", None)
    # ``is True``: every DoFn has an ``unbounded_per_element`` (the decorator, a static method).
    return any(getattr(marked, "unbounded_per_element", None) is True for marked in (fn, process))


def _bounded(pcoll: PCollection[Any]) -> bool:
    """Whether ``pcoll`` ends: Beam says so and nothing upstream reads without end."""
    return bool(pcoll.is_bounded) and not _upstream(pcoll, _unbounded_read)


class _AdmitElements(beam.DoFn):
    """Routes malformed elements to ``.errors`` before they reach the keyed, stateful step."""

    def __init__(self) -> None:
        super().__init__()
        self._error_log = ErrorLog()  # logged like the agent's records (``core.observability``)

    def process(self, element: Any) -> list[Any]:
        """Pass a well-formed element on; log and divert a malformed one."""
        problem = element_problem(element)
        if problem is None:
            return [element]
        self._error_log.report((problem,))
        return [beam.pvalue.TaggedOutput(ERRORS_TAG, problem)]

    def finish_bundle(self) -> None:
        """Count the records the log left out, once its interval is over."""
        if self._error_log.suppressed:
            self._error_log.flush()

    def teardown(self) -> None:
        """Count the records the log left out."""
        self._error_log.flush(final=True)


class RunAgent(beam.PTransform[PCollection[tuple[bytes, AgentEnvelope]], RunAgentOutputs]):
    """Runs ``agent`` for every ``(key, AgentEnvelope)`` element; returns :class:`RunAgentOutputs`.

    Misconfiguration fails at construction with a ``ValueError``; malformed elements become
    ``.errors`` records.
    """

    def __init__(self, agent: AgentFn, config: AgentConfig | None = None) -> None:
        super().__init__()
        if not is_agent(agent):
            raise ValueError(
                f"RunAgent needs an agent defined with `async def agent(ctx)` (or an object "
                f"whose `__call__` is one, such as a framework adapter), got {agent!r}"
            )
        if config is not None and not isinstance(config, AgentConfig):
            raise ValueError(f"RunAgent config must be an AgentConfig, got {type(config).__name__}")
        for budget in () if config is None else config.budgets:
            as_connection(budget.effector)  # refuses a bad effector now, not on workers
        self._agent = agent
        self._config = AgentConfig() if config is None else config

    def expand(self, keyed: PCollection[tuple[bytes, AgentEnvelope]]) -> RunAgentOutputs:
        """Build the transform: admission (only for loosely typed input), then the agent."""
        if not isinstance(keyed.windowing.windowfn, GlobalWindows):
            # State is kept per key and window; a key's seq, memory and continuation must span
            # its whole life, or intent ids would repeat in every window.
            keyed = keyed | "GlobalWindow" >> beam.WindowInto(GlobalWindows())
        config = self._config
        if config.processing_clock is None and _fed_by_test_stream(keyed):
            config = dataclasses.replace(config, processing_clock=epoch_clock)
        admission_errors = None
        if _needs_admission(keyed.element_type):
            admitted = keyed | "Admit" >> beam.ParDo(_AdmitElements()).with_output_types(
                _ENVELOPE_PAIR, errors=AgentError
            ).with_outputs(ERRORS_TAG, main="admitted")
            keyed, admission_errors = admitted.admitted, admitted[ERRORS_TAG]
        dofn = beam.ParDo(
            agent_dofn(
                self._agent, config, ticks=_ticks(keyed.pipeline.runner), bounded=_bounded(keyed)
            )
        )
        activate = (
            dofn.with_input_types(_ENVELOPE_PAIR)
            .with_output_types(
                bytes,
                intents=ToolIntent,
                traces=TraceEvent,
                errors=AgentError,
                records=ActivationRecord,
            )
            .with_outputs(INTENTS_TAG, TRACES_TAG, ERRORS_TAG, RECORDS_TAG, main=OUTPUT_TAG)
        )
        results = keyed | "Activate" >> activate
        # ParDo holds its own copy of the DoFn: that copy is the one serialized to run.
        agent_fn: AgentDoFn = dofn.fn
        agent_fn.trace_if_read(results[TRACES_TAG])
        errors = results[ERRORS_TAG]
        if admission_errors is not None:
            errors = (admission_errors, errors) | "Errors" >> beam.Flatten().with_output_types(
                AgentError
            )
        return RunAgentOutputs(
            output=results[OUTPUT_TAG],
            intents=results[INTENTS_TAG],
            traces=results[TRACES_TAG],
            errors=errors,
            records=results[RECORDS_TAG],
        )


# -- the stateful DoFn: state cells and timers around the Activator ---------------------------
# Two bags: the header (the KeyHeader, then the events buffered behind a suspended run) and the
# memory's elements, which join to one ``MemoryState`` blob (``core.state``).
_HEADER = BagStateSpec("header", BytesCoder())
_MEMORY = BagStateSpec("memory", BytesCoder())
_DEADLINE = TimerSpec("deadline", TimeDomain.REAL_TIME)
_IDLE = TimerSpec("idle", TimeDomain.WATERMARK)
_EARLY_TIMER_PAUSE_S = 0.02
WAITING_REPORT_INTERVAL_S = 15.0
"""How often a DoFn whose runs wait out their deadlines on a local runner says so."""

# DoFn parameter defaults, built once (Beam recognizes them by value). Typed Any because Beam
# substitutes the runtime state object, timer, key or timestamp for each of them.
_HEADER_STATE: Any = beam.DoFn.StateParam(_HEADER)
_MEMORY_STATE: Any = beam.DoFn.StateParam(_MEMORY)
_DEADLINE_TIMER: Any = beam.DoFn.TimerParam(_DEADLINE)
_IDLE_TIMER: Any = beam.DoFn.TimerParam(_IDLE)
_KEY: Any = beam.DoFn.KeyParam
_TIMESTAMP: Any = beam.DoFn.TimestampParam


class _BeamModelCounters:
    """The model gateway's counters as Beam metrics, handed to Beam once per bundle."""

    __slots__ = ("_counters", "_pending")

    def __init__(self) -> None:
        self._counters = {name: Metrics.counter(METRICS_NAMESPACE, name) for name in MODEL_COUNTERS}
        self._pending = dict.fromkeys(MODEL_COUNTERS, 0)

    def inc(self, name: str, value: int = 1) -> None:
        """Add ``value`` to the counter ``name``."""
        self._pending[name] += value

    def flush(self) -> None:
        """Hand the counts since the last flush to Beam."""
        pending = self._pending
        for name, value in pending.items():
            if value:
                self._counters[name].inc(value)
                pending[name] = 0

    def discard(self) -> None:
        """Drop unflushed counts (a bundle that failed does not count)."""
        for name in self._pending:
            self._pending[name] = 0


_LATEST_TIMER_MS = GlobalWindow().max_timestamp().micros // 1000
_EARLIEST_TIMER_MS = MIN_TIMESTAMP.micros // 1000 + 1


def _timestamp(ms: int) -> Timestamp:
    """A timer's time: ``ms``, within the times Beam can set a timer at in the global window."""
    return Timestamp(micros=min(max(ms, _EARLIEST_TIMER_MS), _LATEST_TIMER_MS) * 1000)


def _ms(timestamp: Timestamp) -> int:
    return int(timestamp.micros // 1000)


def _applied(
    plan: Plan, deadline: Any, idle: Any, tick_clock: Callable[[], int] | None, traced: bool
) -> list[Any]:
    """Write the plan's state, set its timers and return its outputs, tagged.

    With ``tick_clock`` a deadline still to come is checked again at once, not set for its time.
    """
    plan.state.commit()
    if plan.deadline_ms is not None:
        if not plan.deadline_ms:
            deadline.clear()
        elif tick_clock is None:
            deadline.set(_timestamp(plan.deadline_ms))
        else:
            deadline.set(_timestamp(min(plan.deadline_ms, tick_clock())))
    if plan.idle_ms is not None:
        idle.set(_timestamp(plan.idle_ms))
    out: list[Any] = plan.outputs  # the plan is done with, so its list is reused
    if plan.intents:
        out.extend([TaggedOutput(INTENTS_TAG, intent) for intent in plan.intents])
    if plan.traces and traced:
        out.extend([TaggedOutput(TRACES_TAG, event) for event in plan.traces])
    if plan.errors:
        out.extend([TaggedOutput(ERRORS_TAG, error) for error in plan.errors])
    if plan.records:
        out.extend([TaggedOutput(RECORDS_TAG, record) for record in plan.records])
    return out


def _is_read(pcoll: PCollection[Any]) -> bool:
    """Whether a transform of ``pcoll``'s pipeline reads it, as a main or a side input."""

    class _Readers(PipelineVisitor):
        found = False

        def visit_transform(self, node: AppliedPTransform) -> None:
            if pcoll in node.inputs or any(side.pvalue is pcoll for side in node.side_inputs):
                self.found = True

    readers = _Readers()
    pcoll.pipeline.visit(readers)
    return readers.found


def _timer_callback(spec: TimerSpec, timer: str, name: str, doc: str) -> Any:
    """The ``DoFn`` method Beam calls when ``spec`` fires: load, activate, apply."""

    def callback(
        self: AgentDoFn,
        key: bytes = _KEY,
        fired: Timestamp = _TIMESTAMP,
        header: Any = _HEADER_STATE,
        memory: Any = _MEMORY_STATE,
        deadline: Any = _DEADLINE_TIMER,
        idle: Any = _IDLE_TIMER,
    ) -> list[Any]:
        assert self._activator is not None
        state = KeyState(header, memory)
        plan = self._activator.activate(key, TimerFired(timer, _ms(fired)), state)
        if plan.errors:
            self._error_log.report(plan.errors)
        self._early_fires += plan.early
        if timer == TRIGGER_DEADLINE:
            self._note_waiting(key, plan)
        elif plan.idle_ms is not None and _timestamp(plan.idle_ms) <= fired:
            plan.idle_ms = None  # due past the last time a timer can be set: it would loop
        return _applied(plan, deadline, idle, self._tick_clock, self._traced)

    callback.__name__ = callback.__qualname__ = name
    callback.__doc__ = doc
    return on_timer(spec)(callback)


class AgentDoFn(beam.DoFn):
    """Runs one agent over ``(key, AgentEnvelope)`` elements; see the module docstring."""

    def __init__(
        self, agent: AgentFn, config: AgentConfig, *, ticks: bool = False, bounded: bool = False
    ) -> None:
        super().__init__()
        self._agent = agent
        self._config = config
        self._ticks = ticks
        self._bounded = bounded
        # Every copy of this DoFn (a retried bundle may get a fresh one) shares one memo.
        self._memo_scope = uuid.uuid4().hex
        self._driver: CoroutineDriver | None = None
        self._gateway: ModelGateway | None = None
        self._budget: BudgetSet | None = None
        self._activator: Activator | None = None
        self._tick_clock: Callable[[], int] | None = None
        self._counters: _BeamModelCounters | None = None
        self._early_fires = 0
        self._idle_bundle = True
        self._waiting: dict[bytes, int] = {}
        """Keys whose deadline ticked before its time, with that deadline (ms)."""
        self._waiting_said = time.monotonic()
        self._connections: list[ToolConnection] = []
        self._error_log = ErrorLog()  # every .errors record is logged, rate-limited
        self._traced = True if config.traces is None else config.traces
        """Whether activations build trace events; see ``AgentConfig.traces``."""
        self._traces: PCollection[TraceEvent] | None = None

    def trace_if_read(self, traces: PCollection[TraceEvent]) -> None:
        """Build trace events only if a transform reads ``traces`` once the pipeline runs."""
        self._traces = traces

    def __getstate__(self) -> dict[str, Any]:
        """The DoFn as it runs: whether its traces are read, not the pipeline that tells."""
        state = self.__dict__.copy()
        traces = state.pop("_traces", None)
        if traces is not None and self._config.traces is None:
            state["_traced"] = _is_read(traces)
        return state

    # -- lifecycle -----------------------------------------------------------------------

    def setup(self) -> None:
        """Create the event loop, model client, circuit breakers and tool connections it owns."""
        config = self._config
        driver = self._driver = CoroutineDriver()
        factory = config.provider_factory
        gateway = None
        if factory is not None:
            threshold = config.circuit_failure_threshold
            self._counters = _BeamModelCounters()
            gateway = ModelGateway(
                factory(),
                retry_policy=config.model_retry,
                breakers=None
                if threshold is None
                else CircuitBreakers(threshold, config.circuit_reset_timeout_s),
                metrics=self._counters,
                memo=answer_memo(self._memo_scope),
            )
        self._gateway = gateway
        self._connections = config.tool_registry.connections()
        for connection in self._connections:  # MCP sessions: opened now, closed in teardown
            connection.open()
        self._budget = BudgetSet(config.budgets) if config.budgets else None
        services = activation_services(
            config, gateway, ToolRunner(), driver.time_left_s, budget=self._budget
        )
        self._activator = Activator(
            self._agent,
            config,
            services,
            driver.run,
            ticks=self._ticks,
            bounded=self._bounded,
            traced=self._traced,
        )
        self._tick_clock = self._activator.processing_ms if self._ticks else None

    def start_bundle(self) -> None:
        """Start counting the bundle's model calls and early deadline timers afresh."""
        self._early_fires = 0
        self._idle_bundle = True
        if self._counters is not None:
            self._counters.discard()

    def finish_bundle(self) -> None:
        """Report the bundle's model calls; pause a bundle of nothing but early timers."""
        if self._counters is not None:
            self._counters.flush()
        if self._error_log.suppressed:
            self._error_log.flush()
        if self._early_fires and self._idle_bundle:
            # A local runner fires a re-armed processing-time timer again when the bundle ends;
            # the pause keeps a key waiting out its deadline from spinning a core.
            self._say_who_waits()
            time.sleep(_EARLY_TIMER_PAUSE_S)

    def _note_waiting(self, key: bytes, plan: Plan) -> None:
        """Remember a key whose deadline ticked early; forget one whose deadline was taken."""
        if plan.early and plan.deadline_ms:
            self._waiting[key] = plan.deadline_ms
        else:
            self._waiting.pop(key, None)

    def _say_who_waits(self) -> None:
        """Say, once per interval, how many runs wait out their deadlines and for how long."""
        now = time.monotonic()
        if not self._waiting or now - self._waiting_said < WAITING_REPORT_INTERVAL_S:
            return
        self._waiting_said = now
        assert self._activator is not None
        next_s = max(0.0, (min(self._waiting.values()) - self._activator.processing_ms()) / 1000)
        progress_line(
            f"RunAgent: {len(self._waiting)} suspended run(s) wait for a result or their "
            f"deadline; the next deadline is in {next_s:.0f} s"
        )

    def teardown(self) -> None:
        """Close the tool connections, the model client and the event loop."""
        self._error_log.flush(final=True)
        connections, self._connections = self._connections, []
        for connection in connections:
            connection.close()
        self._budget = None  # shared by the process's instances: returned at exit
        driver, gateway = self._driver, self._gateway
        self._driver = self._gateway = self._activator = None
        if driver is None:
            return
        try:
            if gateway is not None:
                driver.run(gateway.aclose(), self._config.activation_timeout_s)
        finally:
            driver.close()

    # -- elements and timers -------------------------------------------------------------

    def process(
        self,
        element: tuple[bytes, AgentEnvelope],
        header: Any = _HEADER_STATE,
        memory: Any = _MEMORY_STATE,
        deadline: Any = _DEADLINE_TIMER,
        idle: Any = _IDLE_TIMER,
    ) -> list[Any]:
        """Admit one envelope and run, buffer or refuse it."""
        problem = element_problem(element)
        if problem is not None:
            self._error_log.report((problem,))
            return [TaggedOutput(ERRORS_TAG, problem)]
        assert self._activator is not None
        self._idle_bundle = False
        key, envelope = element
        if self._waiting:
            self._waiting.pop(key, None)  # an answer may end the wait; a tick says again
        state = KeyState(header, memory)
        plan = self._activator.activate(key, envelope, state)
        if plan.errors:
            self._error_log.report(plan.errors)
        return _applied(plan, deadline, idle, self._tick_clock, self._traced)

    # Built by one factory: Beam finds a timer callback by name and reads its state and timer
    # parameters from the defaults, so both need the same long parameter list.
    _on_deadline = _timer_callback(
        _DEADLINE, TRIGGER_DEADLINE, "_on_deadline", "Take a suspension's timeout route."
    )
    _on_idle = _timer_callback(_IDLE, TRIGGER_IDLE, "_on_idle", "Clear an idle key's state.")


class _AgentDoFnWithoutTtl(AgentDoFn):
    """``AgentDoFn`` for a configuration without ``ttl_ms``: no element arms the idle timer."""

    def process(  # type: ignore[override]
        self,
        element: tuple[bytes, AgentEnvelope],
        header: Any = _HEADER_STATE,
        memory: Any = _MEMORY_STATE,
        deadline: Any = _DEADLINE_TIMER,
    ) -> list[Any]:
        """Admit one envelope and run, buffer or refuse it (the idle timer is not bound)."""
        return super().process(element, header, memory, deadline, None)


def agent_dofn(
    agent: AgentFn, config: AgentConfig, *, ticks: bool = False, bounded: bool = False
) -> AgentDoFn:
    """The ``DoFn`` running ``agent``: its ``process`` binds the idle timer only under a TTL.

    ``bounded``: its input ends (a batch pipeline); see ``Activator``.
    """
    kind = AgentDoFn if config.ttl_ms is not None else _AgentDoFnWithoutTtl
    return kind(agent, config, ticks=ticks, bounded=bounded)
