# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""``RunAgent``: run an agent over a keyed stream of envelopes, as one Beam transform.

``keyed | RunAgent(agent, config=AgentConfig(...))`` where ``keyed`` is a
``PCollection[tuple[bytes, AgentEnvelope]]`` returns :class:`RunAgentOutputs`. All four outputs
have deterministic coders (``BytesCoder`` and ``ProtoCoder``), never pickle.

Misconfiguration fails at pipeline construction with a ``ValueError`` that says what to change;
malformed elements at run time become typed ``.errors`` records, never a crashed pipeline.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.pvalue import PCollection
from apache_beam.transforms.window import GlobalWindows
from apache_beam.typehints import typehints

from beam_agents._protos import AgentEnvelope, AgentError, ToolIntent, TraceEvent
from beam_agents.core.agent import AgentFn
from beam_agents.core.dofn import (
    ERRORS_TAG,
    INTENTS_TAG,
    OUTPUT_TAG,
    TRACES_TAG,
    AgentDoFn,
    CommitInfo,
    element_problem,
)
from beam_agents.hitl import HitlPolicy
from beam_agents.model.cache import DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES
from beam_agents.model.client import ModelClient
from beam_agents.model.resilience import RetryPolicy
from beam_agents.tools import ToolRegistry

DEFAULT_INTENT_TTL_MS = 3_600_000
"""How long an intent stays executable unless ``ctx.act(ttl_ms=...)`` says otherwise: 1 hour."""

DEFAULT_ACTIVATION_TIMEOUT_S = 300.0
"""How long one activation may take: 5 minutes."""

DEFAULT_MAX_BUFFERED_EVENTS = 1_000
"""How many external events may wait for one key's suspended run."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _is_count(value: object, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


@dataclass(frozen=True)
class AgentConfig:
    """How ``RunAgent`` runs an agent.

    Attributes:
        provider_factory: Zero-argument callable returning the model client (anything with
            ``async complete(request)``); called once per DoFn instance in ``setup``. Required
            only if the agent calls the model. It is pickled, so make it module level.
        tool_registry: The read-only tools ``ctx.run_tool`` can run, and the side-effecting
            tools whose ``ctx.act`` arguments are validated. Default: empty.
        ttl_ms: Idle-key state lifetime in event time: a key's memory, replay cache and any
            suspended run are cleared ``ttl_ms`` after its last activity (its seq is kept, so
            identifiers never repeat). ``None`` (the default) never cleans up: choose a TTL for
            unbounded key spaces.
        activation_timeout_s: Longest one activation may run; past it, the activation fails
            as ``activation_timeout`` and commits nothing.
        hitl_policy: Deadlines, approval routing and the timeout route for suspended runs.
            Without one, a ``Suspend(timeout_ms=...)`` that times out is dropped to ``.errors``.
        intent_ttl_ms: Default TTL of intents staged with ``ctx.act``.
        max_buffered_events: How many external events may wait for one suspended key; more
            go to ``.errors`` as ``buffer_overflow``.
        model_cache_max_entries: Bound on the replay-cache entries a suspended run keeps.
        model_cache_max_bytes: Bound on a suspended run's serialized replay cache.
        processing_clock: Seconds since the epoch on the runner's processing-time clock, used
            to place suspension deadlines. Default ``time.time``. A ``TestStream`` pipeline on
            the DirectRunner starts its processing clock at the epoch: pass
            ``beam_agents.testing.test_stream_clock`` there.
        before_commit: Called with a :class:`CommitInfo` just before an activation or timer
            firing commits; if it raises, the bundle fails and the runner retries it.
            ``beam_agents.testing.FailFirstCommit`` uses it to force retries in tests.
        model_retry: How model calls that fail with a retryable ``ProviderError`` (rate
            limits, server errors, timeouts) are retried, within what remains of
            ``activation_timeout_s``. Default ``RetryPolicy()``; ``None`` (or
            ``RetryPolicy(max_attempts=1)``) makes one attempt. A call that fails for good
            fails the activation as ``model_error`` unless the agent handles the error.
        circuit_failure_threshold: Consecutive retryable failures of one endpoint (base URL
            and model) after which each ``DoFn`` instance's circuit breaker for it opens and
            calls fail fast with ``CircuitOpenError``; ``None`` disables circuit breaking.
        circuit_reset_timeout_s: How long an open circuit refuses calls before it lets one
            trial call through.
        max_tokens_per_run: Token budget of one run (its first activation and every resume):
            a model call whose reported usage takes the run past it fails the activation as
            ``budget_exceeded``. ``None`` (the default): no budget.
    """

    provider_factory: Callable[[], ModelClient] | None = None
    tool_registry: ToolRegistry = field(default_factory=ToolRegistry)
    ttl_ms: int | None = None
    activation_timeout_s: float = DEFAULT_ACTIVATION_TIMEOUT_S
    hitl_policy: HitlPolicy | None = None
    intent_ttl_ms: int = DEFAULT_INTENT_TTL_MS
    max_buffered_events: int = DEFAULT_MAX_BUFFERED_EVENTS
    model_cache_max_entries: int = DEFAULT_MAX_ENTRIES
    model_cache_max_bytes: int = DEFAULT_MAX_BYTES
    processing_clock: Callable[[], float] = time.time
    before_commit: Callable[[CommitInfo], None] | None = None
    model_retry: RetryPolicy | None = field(default_factory=RetryPolicy)
    circuit_failure_threshold: int | None = 5
    circuit_reset_timeout_s: float = 30.0
    max_tokens_per_run: int | None = None

    def __post_init__(self) -> None:
        _require(
            self.provider_factory is None or callable(self.provider_factory),
            "AgentConfig.provider_factory must be a zero-argument callable that returns the "
            f"model client (e.g. a module-level function), got {self.provider_factory!r}",
        )
        _require(
            isinstance(self.tool_registry, ToolRegistry),
            "AgentConfig.tool_registry must be a beam_agents.tools.ToolRegistry, got "
            f"{type(self.tool_registry).__name__}",
        )
        _require(
            self.ttl_ms is None or _is_count(self.ttl_ms, 1),
            f"AgentConfig.ttl_ms must be a positive int of milliseconds or None (never clean "
            f"up), got {self.ttl_ms!r}",
        )
        timeout = self.activation_timeout_s
        _require(
            isinstance(timeout, int | float)
            and not isinstance(timeout, bool)
            and math.isfinite(timeout)
            and timeout > 0,
            f"AgentConfig.activation_timeout_s must be a positive number of seconds, got "
            f"{timeout!r}",
        )
        _require(
            self.hitl_policy is None or isinstance(self.hitl_policy, HitlPolicy),
            "AgentConfig.hitl_policy must be a beam_agents.HitlPolicy or None, got "
            f"{type(self.hitl_policy).__name__}",
        )
        for name in ("intent_ttl_ms", "max_buffered_events", "model_cache_max_entries"):
            value = getattr(self, name)
            _require(_is_count(value, 1), f"AgentConfig.{name} must be an int >= 1, got {value!r}")
        _require(
            _is_count(self.model_cache_max_bytes, 0),
            f"AgentConfig.model_cache_max_bytes must be an int >= 0 (0 disables the replay "
            f"cache), got {self.model_cache_max_bytes!r}",
        )
        _require(
            callable(self.processing_clock),
            "AgentConfig.processing_clock must be a callable returning epoch seconds",
        )
        _require(
            self.before_commit is None or callable(self.before_commit),
            "AgentConfig.before_commit must be a callable or None",
        )
        _require(
            self.model_retry is None or isinstance(self.model_retry, RetryPolicy),
            "AgentConfig.model_retry must be a beam_agents.model.resilience.RetryPolicy or None "
            f"(no retries), got {type(self.model_retry).__name__}",
        )
        _require(
            self.circuit_failure_threshold is None or _is_count(self.circuit_failure_threshold, 1),
            "AgentConfig.circuit_failure_threshold must be an int >= 1 or None (no circuit "
            f"breaking), got {self.circuit_failure_threshold!r}",
        )
        reset = self.circuit_reset_timeout_s
        _require(
            isinstance(reset, int | float)
            and not isinstance(reset, bool)
            and math.isfinite(reset)
            and reset >= 0,
            f"AgentConfig.circuit_reset_timeout_s must be a number of seconds >= 0, got {reset!r}",
        )
        _require(
            self.max_tokens_per_run is None or _is_count(self.max_tokens_per_run, 1),
            "AgentConfig.max_tokens_per_run must be an int >= 1 or None (no budget), got "
            f"{self.max_tokens_per_run!r}",
        )
        policy = self.hitl_policy
        if policy is not None and self.ttl_ms is not None:
            _require(
                self.ttl_ms > policy.timeout_ms,
                f"AgentConfig.ttl_ms ({self.ttl_ms} ms) must be longer than "
                f"hitl_policy.timeout_ms ({policy.timeout_ms} ms), or idle-key cleanup would "
                "wipe suspended runs before their timeout route could decide; raise ttl_ms or "
                "lower the policy's timeout",
            )


class RunAgentOutputs(NamedTuple):
    """What ``RunAgent`` returns.

    ``output``: the bytes of every non-empty ``Complete`` (and ``Deny``). ``intents``: the
    committed ``ToolIntent``s, for the effector. ``traces``: ``TraceEvent``s. ``errors``:
    ``AgentError`` dead letters (reason, detail, event time, and the original envelope bytes so
    they can be re-driven).
    """

    output: PCollection[bytes]
    intents: PCollection[ToolIntent]
    traces: PCollection[TraceEvent]
    errors: PCollection[AgentError]


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
            "payload in AgentEnvelope(entity_key=..., event_time_ms=..., external_event=...)"
        )
    return key_type is not bytes or value_type is not AgentEnvelope


class _AdmitElements(beam.DoFn):
    """Routes malformed elements to ``.errors`` before they reach the keyed, stateful step."""

    def process(self, element: Any) -> list[Any]:
        problem = element_problem(element)
        return [element] if problem is None else [problem]


class RunAgent(beam.PTransform[PCollection[tuple[bytes, AgentEnvelope]], RunAgentOutputs]):
    """Runs ``agent`` for every ``(key, AgentEnvelope)`` element: see the module docstring."""

    def __init__(self, agent: AgentFn, config: AgentConfig | None = None) -> None:
        super().__init__()
        if not inspect.iscoroutinefunction(agent):
            raise ValueError(
                f"RunAgent needs an agent defined with `async def agent(ctx)`, got {agent!r}"
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
        admission_errors = None
        if _needs_admission(keyed.element_type):
            admitted = keyed | "Admit" >> beam.ParDo(_AdmitElements()).with_output_types(
                _ENVELOPE_PAIR, errors=AgentError
            ).with_outputs(ERRORS_TAG, main="admitted")
            keyed, admission_errors = admitted.admitted, admitted[ERRORS_TAG]
        activate = (
            beam.ParDo(AgentDoFn(self._agent, self._config))
            .with_input_types(_ENVELOPE_PAIR)
            .with_output_types(bytes, intents=ToolIntent, traces=TraceEvent, errors=AgentError)
            .with_outputs(INTENTS_TAG, TRACES_TAG, ERRORS_TAG, main=OUTPUT_TAG)
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
        )
