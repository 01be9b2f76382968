"""``AgentConfig``, the human-in-the-loop policy and ``RecordOptions``, checked when built."""

from __future__ import annotations

import hashlib
import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeAlias, TypeGuard

from beam_agents._protos.bounds import MAX_BUDGET_AMOUNT, MAX_LEDGER_CHARS, window_ms
from beam_agents.core.agent import MAX_DURATION_MS, FallbackContext, positive_ms
from beam_agents.core.model_calls import DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES
from beam_agents.model.client import CompletesRequests
from beam_agents.model.resilience import RetryPolicy
from beam_agents.tools import ToolRegistry

TRIGGER_EVENT = "event"
TRIGGER_TOOL_RESULT = "tool_result"
TRIGGER_APPROVAL = "approval"
TRIGGER_DEADLINE = "deadline"
TRIGGER_IDLE = "idle"


@dataclass(frozen=True, slots=True)
class CommitInfo:
    """Identifies a commit about to happen, for ``AgentConfig.before_commit``.

    ``trigger`` is ``"event"``, ``"tool_result"``, ``"approval"``, ``"deadline"`` or
    ``"idle"``. ``first_step`` is the run's high-water step when the activation began, so
    ``(entity_key, seq, trigger, first_step)`` names one activation across bundle retries.
    """

    entity_key: bytes
    seq: int
    trigger: str
    first_step: int


DEFAULT_INTENT_TTL_MS = 3_600_000
"""How long an intent stays executable unless ``ctx.act(ttl_ms=...)`` says otherwise: 1 hour."""

DEFAULT_ACTIVATION_TIMEOUT_S = 300.0
"""How long one activation may take: 5 minutes."""

DEFAULT_MAX_BUFFERED_EVENTS = 1_000
"""How many external events may wait for one key's suspended run."""

DEFAULT_RESULT_GRACE_MS = 300_000
"""How long past its intents' longest TTL a run with no timeout waits for a result: 5 minutes."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _is_count(value: object, minimum: int) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _is_duration(value: object) -> TypeGuard[int]:
    return _is_count(value, 1) and value <= MAX_DURATION_MS


def _is_seconds(value: object, *, positive: bool) -> bool:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return False
    return value > 0 if positive else value >= 0


_MICROS = 1_000_000


@dataclass(frozen=True)
class Budget:
    """A fleet budget: tokens and/or cost per window, shared by every key, worker and pipeline.

    The effector at ``effector`` keeps the ledger (``docs/fleet.md``, "Fleet budgets").

    Attributes:
        name: The ledger's name; every pipeline that names it shares it.
        effector: The effector keeping the ledger: ``"HOST:PORT"`` or a
            ``beam_agents.io.EffectorConnection`` (token, TLS).
        tokens: The cap on input plus output tokens per window (``None``: no token cap).
        requests: The cap on provider calls per window (``None``: none); with a short window,
            a request-rate limit (``Budget("openai-rpm", ..., requests=500, window="1m")``).
        cost_usd: The cap on cost per window, in US dollars (``None``: no cost cap); needs
            ``prices``.
        prices: US dollars per million input and output tokens, by model name.
        window: The window's length: ``"90s"``, ``"15m"``, ``"24h"``, ``"7d"``. Windows start at
            multiples of it since the Unix epoch (a day's window starts at 00:00 UTC).
        tenant_separator: With one, each tenant (a key's text up to the separator) gets a
            ledger of its own, ``name/tenant``, with the same caps.
        chunk_tokens: The allowance a worker leases at a time (default: a fiftieth of the cap,
            at least 1, at most 100,000).
        chunk_cost_usd: The cost allowance leased at a time (default: a fiftieth of the cap).
        chunk_requests: The calls leased at a time (default: a fiftieth of the cap, at least 1).
    """

    name: str
    effector: object
    tokens: int | None = None
    cost_usd: float | None = None
    prices: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    window: str = "24h"
    tenant_separator: str | None = None
    chunk_tokens: int | None = None
    chunk_cost_usd: float | None = None
    requests: int | None = None
    chunk_requests: int | None = None

    def __post_init__(self) -> None:
        _require(
            isinstance(self.name, str) and 0 < len(self.name) <= 200 and self.name.isprintable(),
            f"Budget.name must be printable text of 1 to 200 chars, got {self.name!r}",
        )
        _require(
            self.tokens is not None or self.cost_usd is not None or self.requests is not None,
            "a Budget needs a cap: tokens, cost_usd, requests or several",
        )
        for name in ("tokens", "requests", "chunk_tokens", "chunk_requests"):
            value = getattr(self, name)
            _require(
                value is None or (_is_count(value, 1) and value <= MAX_BUDGET_AMOUNT),
                f"Budget.{name} must be an int from 1 to 2**53 or None, got {value!r}",
            )
        for name in ("cost_usd", "chunk_cost_usd"):
            value = getattr(self, name)
            _require(
                value is None
                or (_is_seconds(value, positive=True) and value * 1e6 <= MAX_BUDGET_AMOUNT),
                f"Budget.{name} must be a positive number of dollars (2**53 millionths at "
                f"most) or None, got {value!r}",
            )
        _require(
            self.cost_usd is None or bool(self.prices),
            "Budget.cost_usd needs prices: {model: (usd_per_million_in, usd_per_million_out)}",
        )
        for model, price in dict(self.prices).items():
            _require(
                isinstance(model, str)
                and isinstance(price, tuple)
                and len(price) == 2
                and all(_is_seconds(part, positive=False) for part in price),
                f"Budget.prices maps a model name to (input, output) US dollars per million "
                f"tokens, got {model!r}: {price!r}",
            )
        self.window_ms  # noqa: B018 - checks the window
        _require(
            self.tenant_separator is None
            or (isinstance(self.tenant_separator, str) and 0 < len(self.tenant_separator) <= 16),
            f"Budget.tenant_separator must be 1 to 16 chars or None, got {self.tenant_separator!r}",
        )

    @property
    def window_ms(self) -> int:
        """The window's length in milliseconds."""
        length = window_ms(self.window)
        _require(
            length is not None,
            f"Budget.window must be a duration like 90s, 15m, 24h or 7d, from 1 ms to 366 days, "
            f"got {self.window!r}",
        )
        assert length is not None
        return length

    @property
    def cap_cost_micros(self) -> int:
        """The cost cap in millionths of a dollar (0: none)."""
        return 0 if self.cost_usd is None else round(self.cost_usd * _MICROS)

    @property
    def lease_tokens(self) -> int:
        """The token allowance leased at a time (0: no token cap)."""
        if self.tokens is None:
            return 0
        return self.chunk_tokens or min(max(self.tokens // 50, 1), 100_000)

    @property
    def lease_cost_micros(self) -> int:
        """The cost allowance leased at a time, in millionths of a dollar (0: no cost cap)."""
        if self.chunk_cost_usd is not None:
            return max(round(self.chunk_cost_usd * _MICROS), 1)
        return max(self.cap_cost_micros // 50, 1) if self.cost_usd is not None else 0

    @property
    def lease_requests(self) -> int:
        """The calls leased at a time (0: no request cap)."""
        if self.requests is None:
            return 0
        return self.chunk_requests or max(self.requests // 50, 1)

    def ledger_for(self, entity_key: bytes) -> str:
        """The ledger ``entity_key``'s calls are debited from: ``name`` or ``name/tenant``.

        A tenant's characters that are not printable are escaped as Python escapes them, and a
        tenant too long for a ledger name is cut and told apart by a digest of it.
        """
        separator = self.tenant_separator
        if separator is None:
            return self.name
        text = entity_key.decode("utf-8", "replace")
        tenant, found, _ = text.partition(separator)
        shown = "".join(
            char if char.isprintable() else char.encode("unicode_escape").decode("ascii")
            for char in (tenant if found else text)
        )
        room = MAX_LEDGER_CHARS - len(self.name) - 1
        if len(shown) > room:
            digest = hashlib.sha256(shown.encode()).hexdigest()[:16]
            shown = f"{shown[: room - 18]}~{digest}"
        return f"{self.name}/{shown}"

    def cost_micros(self, model: str, input_tokens: int, output_tokens: int) -> int:
        """The cost of a call in millionths of a dollar (0 without a cost cap).

        Raises ``ValueError`` for a model ``prices`` does not list.
        """
        if self.cost_usd is None:
            return 0
        price = self.prices.get(model)
        if price is None:
            raise ValueError(
                f"Budget {self.name!r} has no price for model {model!r}; add it to "
                f"Budget.prices (known: {', '.join(sorted(self.prices)) or 'none'})"
            )
        return math.ceil(input_tokens * price[0] + output_tokens * price[1])


@dataclass(frozen=True)
class AgentConfig:
    """How ``RunAgent`` runs an agent.

    Attributes:
        provider_factory: Zero-argument callable returning the model client (anything with
            ``async complete(request)``); called once per DoFn instance in ``setup``. Required
            only if the agent calls the model. It is pickled, so make it module level.
        tool_registry: The read-only tools ``ctx.run_tool`` can run, and the side-effecting
            tools whose ``ctx.act`` arguments are validated. Default: empty.
        ttl_ms: Idle-key state lifetime in event time: a key's memory and any suspended run are
            cleared ``ttl_ms`` after its last activity (its seq is kept). ``None`` (the
            default) never cleans up: choose a TTL for unbounded key spaces.
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
            to place suspension deadlines. ``None`` (the default): the wall clock, or the
            DirectRunner's test clock (``beam_agents.testing.epoch_clock``) when a
            ``TestStream`` feeds ``RunAgent``.
        before_commit: Called with a :class:`CommitInfo` just before an activation or timer
            firing commits; if it raises, the bundle fails and the runner retries it.
        model_retry: How model calls that fail with a retryable ``ProviderError`` are
            retried, within what remains of ``activation_timeout_s``; ``None`` makes one attempt.
        circuit_failure_threshold: Consecutive retryable failures of one endpoint after which
            its circuit opens and calls fail fast; ``None`` disables circuit breaking.
        circuit_reset_timeout_s: How long an open circuit refuses calls before it lets one
            trial call through.
        max_tokens_per_run: Token budget of one run (its first activation and every resume):
            a model call whose reported usage takes the run past it fails the activation as
            ``budget_exceeded``. ``None`` (the default): no budget.
        namespace: Folded into every intent id this agent mints (``intent_id_for``). Set a
            distinct one for each agent or pipeline sharing an effector, and a new one for a
            fresh-state redeploy over new events (``docs/concepts/runtime.md``). A suspended
            run keeps the namespace it started with.
        record: ``True`` (or a ``RecordOptions``) emits one ``ActivationRecord`` per commit on
            ``.records``, for ``beam-agents replay`` (``docs/replay.md``).
        result_grace_ms: A suspension with neither ``Suspend.timeout_ms`` nor a ``HitlPolicy``
            still gets a deadline: the longest TTL window of its pending intents plus this
            grace (processing time, default 5 minutes), so no run waits forever for a result
            that never comes (``docs/concepts/runtime.md``, "The lifecycle of a run").
        budget: A fleet budget (or a tuple of them, such as a daily token budget and a
            provider's request-rate limit) every model call of this agent is admitted by and
            debited from (``docs/fleet.md``); at a cap ``ctx.call_model`` raises
            ``BudgetExceeded``.
        traces: Whether activations build trace events for ``.traces``. ``None`` (the
            default): only if a transform of the pipeline reads ``.traces`` when it runs;
            ``True``: always (for readers the pipeline cannot see, such as Interactive Beam);
            ``False``: never.
    """

    provider_factory: Callable[[], CompletesRequests] | None = None
    tool_registry: ToolRegistry = field(default_factory=ToolRegistry)
    ttl_ms: int | None = None
    activation_timeout_s: float = DEFAULT_ACTIVATION_TIMEOUT_S
    hitl_policy: HitlPolicy | None = None
    intent_ttl_ms: int = DEFAULT_INTENT_TTL_MS
    max_buffered_events: int = DEFAULT_MAX_BUFFERED_EVENTS
    model_cache_max_entries: int = DEFAULT_MAX_ENTRIES
    model_cache_max_bytes: int = DEFAULT_MAX_BYTES
    processing_clock: Callable[[], float] | None = None
    before_commit: Callable[[CommitInfo], None] | None = None
    model_retry: RetryPolicy | None = field(default_factory=RetryPolicy)
    circuit_failure_threshold: int | None = 5
    circuit_reset_timeout_s: float = 30.0
    max_tokens_per_run: int | None = None
    namespace: str | None = None
    record: bool | RecordOptions = False
    result_grace_ms: int = DEFAULT_RESULT_GRACE_MS
    traces: bool | None = None
    budget: Budget | tuple[Budget, ...] | None = None

    @property
    def budgets(self) -> tuple[Budget, ...]:
        """The fleet budgets every model call is admitted by, in order (``()``: none)."""
        if self.budget is None:
            return ()
        return self.budget if isinstance(self.budget, tuple) else (self.budget,)

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
            self.ttl_ms is None or _is_duration(self.ttl_ms),
            f"AgentConfig.ttl_ms must be a positive int of milliseconds (at most "
            f"{MAX_DURATION_MS}) or None (never clean up), got {self.ttl_ms!r}",
        )
        _require(
            _is_seconds(self.activation_timeout_s, positive=True),
            f"AgentConfig.activation_timeout_s must be a positive number of seconds, got "
            f"{self.activation_timeout_s!r}",
        )
        _require(
            self.hitl_policy is None or isinstance(self.hitl_policy, HitlPolicy),
            "AgentConfig.hitl_policy must be a beam_agents.HitlPolicy or None, got "
            f"{type(self.hitl_policy).__name__}",
        )
        _require(
            _is_duration(self.result_grace_ms),
            f"AgentConfig.result_grace_ms must be a positive int of milliseconds (at most "
            f"{MAX_DURATION_MS}), got {self.result_grace_ms!r}",
        )
        _require(
            _is_duration(self.intent_ttl_ms),
            f"AgentConfig.intent_ttl_ms must be a positive int of milliseconds (at most "
            f"{MAX_DURATION_MS}), got {self.intent_ttl_ms!r}",
        )
        for name in ("max_buffered_events", "model_cache_max_entries"):
            value = getattr(self, name)
            _require(_is_count(value, 1), f"AgentConfig.{name} must be an int >= 1, got {value!r}")
        _require(
            _is_count(self.model_cache_max_bytes, 0),
            f"AgentConfig.model_cache_max_bytes must be an int >= 0 (0 disables the replay "
            f"cache), got {self.model_cache_max_bytes!r}",
        )
        _require(
            self.processing_clock is None or callable(self.processing_clock),
            "AgentConfig.processing_clock must be None or a callable returning epoch seconds",
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
        _require(
            _is_seconds(self.circuit_reset_timeout_s, positive=False),
            "AgentConfig.circuit_reset_timeout_s must be a number of seconds >= 0, got "
            f"{self.circuit_reset_timeout_s!r}",
        )
        _require(
            self.max_tokens_per_run is None or _is_count(self.max_tokens_per_run, 1),
            "AgentConfig.max_tokens_per_run must be an int >= 1 or None (no budget), got "
            f"{self.max_tokens_per_run!r}",
        )
        _require(
            self.traces is None or isinstance(self.traces, bool),
            "AgentConfig.traces must be True, False or None (only when .traces is read), got "
            f"{self.traces!r}",
        )
        _require(
            self.namespace is None or (isinstance(self.namespace, str) and bool(self.namespace)),
            "AgentConfig.namespace must be a non-empty str or None (the default intent ids), "
            f"got {self.namespace!r}",
        )
        budgets = self.budgets
        _require(
            all(isinstance(budget, Budget) for budget in budgets)
            and len({budget.name for budget in budgets}) == len(budgets),
            "AgentConfig.budget must be a beam_agents.Budget, a tuple of them with distinct "
            f"names, or None, got {self.budget!r}",
        )
        record_options(self.record)  # raises on anything but a bool or RecordOptions
        policy = self.hitl_policy
        if policy is not None and self.ttl_ms is not None:
            _require(
                self.ttl_ms > policy.timeout_ms,
                f"AgentConfig.ttl_ms ({self.ttl_ms} ms) must be longer than "
                f"hitl_policy.timeout_ms ({policy.timeout_ms} ms), or idle-key cleanup would "
                "wipe suspended runs before their timeout route could decide; raise ttl_ms or "
                "lower the policy's timeout",
            )


@dataclass(frozen=True, slots=True)
class Deny:
    """End the suspended run; emit ``output`` on ``.output`` when it is not empty.

    ``compensate=True`` also stages, newest first, the linked compensation of each effect the
    run staged with ``compensate_with`` and did not compensate yet.
    """

    output: bytes = b""
    compensate: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.output, bytes):
            raise TypeError(f"Deny.output must be bytes, got {type(self.output).__name__}")
        if not isinstance(self.compensate, bool):
            raise TypeError(f"Deny.compensate must be a bool, got {self.compensate!r}")


@dataclass(frozen=True, slots=True)
class Drop:
    """End the suspended run and record it on ``.errors`` as ``suspension_dropped``."""


@dataclass(frozen=True, slots=True)
class Escalate:
    """Ask again: stage a fresh approval intent and suspend with a new deadline."""


Route: TypeAlias = Deny | Drop | Escalate
"""What a timeout route returns."""

TimeoutRoute: TypeAlias = Callable[[FallbackContext], Route]
"""The shape of ``HitlPolicy.on_timeout``."""


@dataclass(frozen=True)
class HitlPolicy:
    """How a pipeline waits for people: deadlines, approval routing and the timeout route.

    ``timeout_ms``: processing time a suspended run waits before ``on_timeout`` decides.
    ``intent_ttl_ms`` and ``approval_channel``: the defaults of approval intents.
    ``max_escalations``: how often ``Escalate`` may re-ask before a ``Deny(exhausted_output)``.
    ``required_approvals``: distinct approvers an approval needs (any deny denies).
    """

    timeout_ms: int
    intent_ttl_ms: int
    approval_channel: str
    on_timeout: TimeoutRoute
    max_escalations: int = 0
    exhausted_output: bytes = b""
    required_approvals: int = 1

    def __post_init__(self) -> None:
        positive_ms("HitlPolicy.timeout_ms", self.timeout_ms)
        positive_ms("HitlPolicy.intent_ttl_ms", self.intent_ttl_ms)
        _require(
            isinstance(self.approval_channel, str),
            "HitlPolicy.approval_channel must be a str, "
            f"got {type(self.approval_channel).__name__}",
        )
        _require(
            _is_count(self.max_escalations, 0),
            f"HitlPolicy.max_escalations must be an int >= 0, got {self.max_escalations!r}",
        )
        _require(
            isinstance(self.exhausted_output, bytes),
            "HitlPolicy.exhausted_output must be bytes, "
            f"got {type(self.exhausted_output).__name__}",
        )
        check_required_approvals(self.required_approvals, "HitlPolicy.required_approvals")
        _check_route_function(self.on_timeout)

    def decide(self, fallback: FallbackContext, escalations_so_far: int) -> Route:
        """The route for a timed-out suspension; ``Escalate`` past the limit becomes a ``Deny``."""
        route = self.on_timeout(fallback)
        if not isinstance(route, Deny | Drop | Escalate):
            raise TypeError(
                f"HitlPolicy.on_timeout must return Deny, Drop or Escalate, "
                f"got {type(route).__name__}"
            )
        if isinstance(route, Escalate) and escalations_so_far >= self.max_escalations:
            return Deny(self.exhausted_output)
        return route


MAX_REQUIRED_APPROVALS = 100
"""The largest quorum an approval may ask for."""


def check_required_approvals(value: object, name: str) -> int:
    """``value`` if it is an int from 1 to ``MAX_REQUIRED_APPROVALS``; raises ``ValueError``."""
    if not (_is_count(value, 1) and value <= MAX_REQUIRED_APPROVALS):
        raise ValueError(f"{name} must be an int from 1 to {MAX_REQUIRED_APPROVALS}, got {value!r}")
    return value


def _check_route_function(on_timeout: object) -> None:
    if not callable(on_timeout):
        raise ValueError(f"HitlPolicy.on_timeout must be a function, got {on_timeout!r}")
    if inspect.iscoroutinefunction(on_timeout):
        raise ValueError(
            "HitlPolicy.on_timeout must be synchronous: a timeout route decides from its "
            "FallbackContext alone and may not await anything"
        )
    qualname = getattr(on_timeout, "__qualname__", "")
    if not inspect.isfunction(on_timeout) or "<" in qualname or "." in qualname:
        raise ValueError(
            f"HitlPolicy.on_timeout must be a module-level function (def at the top of a "
            f"module), got {qualname or on_timeout!r}; lambdas, nested functions and methods "
            "are not accepted because the route must be pure and pickle by reference"
        )


# -- activation records: how AgentConfig(record=...) records ----------------------------------
DEFAULT_MAX_VALUE_BYTES = 16 * 1024
"""Memory slots up to this size (encoded) are recorded whole; larger ones by digest only."""


@dataclass(frozen=True)
class RecordOptions:
    """How activations are recorded (``AgentConfig(record=RecordOptions(...))``)."""

    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES

    def __post_init__(self) -> None:
        value = self.max_value_bytes
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"RecordOptions.max_value_bytes must be an int >= 0, got {value!r}")


def record_options(record: object) -> RecordOptions | None:
    """``AgentConfig.record`` as options: ``None`` when recording is off."""
    if record is True:
        return RecordOptions()
    if record is False or record is None:
        return None
    if isinstance(record, RecordOptions):
        return record
    raise ValueError(
        f"AgentConfig.record must be a bool or a RecordOptions, got {type(record).__name__}"
    )
