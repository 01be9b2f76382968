# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""``RunAgent``: run an agent over a keyed stream of envelopes, as one Beam transform.

``keyed | RunAgent(agent, config=AgentConfig(...))`` where ``keyed`` is a
``PCollection[tuple[bytes, AgentEnvelope]]`` returns :class:`RunAgentOutputs`. All its outputs
have deterministic coders (``BytesCoder`` and ``ProtoCoder``), never pickle.

Misconfiguration fails at pipeline construction with a ``ValueError`` that says what to change;
malformed elements at run time become typed ``.errors`` records, never a crashed pipeline.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.pvalue import PCollection
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms.window import GlobalWindows
from apache_beam.typehints import typehints

from beam_agents._protos import ActivationRecord, AgentEnvelope, AgentError, ToolIntent, TraceEvent
from beam_agents.core.activation import element_problem
from beam_agents.core.agent import AgentFn, epoch_clock, is_agent
from beam_agents.core.config import AgentConfig, CommitInfo
from beam_agents.core.dofn import (
    ERRORS_TAG,
    INTENTS_TAG,
    OUTPUT_TAG,
    RECORDS_TAG,
    TRACES_TAG,
    agent_dofn,
)
from beam_agents.core.observability import ErrorLog

__all__ = ["AgentConfig", "CommitInfo", "RunAgent", "RunAgentOutputs"]


class RunAgentOutputs(NamedTuple):
    """What ``RunAgent`` returns.

    ``output``: the bytes of every non-empty ``Complete`` (and ``Deny``). ``intents``: the
    committed ``ToolIntent``s, for the effector. ``traces``: ``TraceEvent``s. ``errors``:
    ``AgentError`` dead letters (reason, detail, event time, and the original envelope bytes so
    they can be re-driven; for an exception, its trimmed ``traceback``, and the detail names the
    agent's file and line). Every record is also logged at WARNING, rate-limited, whether or not
    ``errors`` is consumed. ``records``: one ``ActivationRecord`` per committed activation with
    ``AgentConfig(record=True)`` (``beam_agents/replay/README.md``); otherwise empty.
    """

    output: PCollection[bytes]
    intents: PCollection[ToolIntent]
    traces: PCollection[TraceEvent]
    errors: PCollection[AgentError]
    records: PCollection[ActivationRecord]


_ENVELOPE_PAIR = typehints.Tuple[bytes, AgentEnvelope]


def _needs_admission(element_type: Any) -> bool:
    """Whether elements must be checked before the keyed, stateful step.

    ``False`` for exactly ``Tuple[bytes, AgentEnvelope]``; ``True`` for hints that admit such
    pairs among other things (``Any``, ``Tuple[Any, AgentEnvelope]``, unions); a ``ValueError``
    saying what to change for hints that rule them out.
    """
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
    """Whether deadlines tick (checked again every bundle until due): on the ``FnApiRunner``.

    It fires a processing-time timer when the bundle that set it ends, and holds back one
    re-set for later until every running read has finished.
    """
    return isinstance(runner, FnApiRunner)


def _fed_by_test_stream(pcoll: PCollection[Any]) -> bool:
    """Whether a ``TestStream`` is upstream of ``pcoll`` (its runner then keeps a test clock)."""
    seen: set[int] = set()
    producers = [pcoll.producer]
    while producers:
        applied = producers.pop()
        if applied is None or id(applied) in seen:
            continue
        seen.add(id(applied))
        if isinstance(applied.transform, TestStream):
            return True
        producers.extend(upstream.producer for upstream in applied.main_inputs.values())
        producers.extend(applied.parts)
    return False


class _AdmitElements(beam.DoFn):
    """Routes malformed elements to ``.errors`` before they reach the keyed, stateful step."""

    def __init__(self) -> None:
        super().__init__()
        self._error_log = ErrorLog()  # logged like the agent's records (``core/loudness.py``)

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
    """Runs ``agent`` for every ``(key, AgentEnvelope)`` element: see the module docstring."""

    def __init__(self, agent: AgentFn, config: AgentConfig | None = None) -> None:
        super().__init__()
        if not is_agent(agent):
            raise ValueError(
                f"RunAgent needs an agent defined with `async def agent(ctx)` (or an object "
                f"whose `__call__` is one, such as a framework adapter), got {agent!r}"
            )
        if config is not None and not isinstance(config, AgentConfig):
            raise ValueError(f"RunAgent config must be an AgentConfig, got {type(config).__name__}")
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
        activate = (
            beam.ParDo(agent_dofn(self._agent, config, ticks=_ticks(keyed.pipeline.runner)))
            .with_input_types(_ENVELOPE_PAIR)
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
