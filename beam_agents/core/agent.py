"""What an agent is and returns, plus the ids, clocks, errors and coroutine driver under it.

An agent is a module-level ``async def agent(ctx: ActivationContext) -> Complete | Suspend``.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import inspect
import time
import uuid
from collections.abc import Coroutine, Generator
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar

from beam_agents._protos import MAX_TIME_MS, hyphenated, uuid5_hex
from beam_agents.tools.errors import ToolError

__all__ = [
    "INTENT_NAMESPACE",
    "Complete",
    "FallbackContext",
    "Outcome",
    "Suspend",
    "intent_id_for",
]


@dataclass(frozen=True, slots=True)
class FallbackContext:
    """What a HITL timeout route (``HitlPolicy.on_timeout``) is given to decide on.

    Every field is a pure function of the key's state and the timer, so a retry decides alike.
    ``deadline_ms`` and ``fired_at_ms`` are processing time, in epoch milliseconds.
    """

    entity_key: bytes
    seq: int
    snapshot: bytes
    deadline_ms: int
    fired_at_ms: int
    pending_intent_ids: frozenset[str]


@dataclass(frozen=True, slots=True)
class Complete:
    """The run is finished; a non-empty ``output`` is emitted on ``RunAgentOutputs.output``."""

    output: bytes = b""

    def __post_init__(self) -> None:
        if not isinstance(self.output, bytes):
            raise TypeError(
                f"Complete.output must be bytes, got {type(self.output).__name__}; "
                "encode text with .encode() or structured data with canonical_json_bytes() "
                "(`from beam_agents import canonical_json_bytes`)"
            )


@dataclass(frozen=True, slots=True)
class Suspend:
    """Persist the run and wait for results of the intents it is waiting on.

    ``snapshot`` comes back as ``ctx.snapshot`` when the run resumes; ``adapter`` names the
    framework adapter that wrote it. ``timeout_ms`` overrides the HITL policy's timeout.
    """

    snapshot: bytes = b""
    adapter: str = ""
    timeout_ms: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.snapshot, bytes):
            raise TypeError(f"Suspend.snapshot must be bytes, got {type(self.snapshot).__name__}")
        if not isinstance(self.adapter, str):
            raise TypeError(f"Suspend.adapter must be str, got {type(self.adapter).__name__}")
        if self.timeout_ms is not None:
            positive_ms("Suspend.timeout_ms", self.timeout_ms)


MAX_DURATION_MS = MAX_TIME_MS
"""The longest timeout or TTL (about 8,000 years), so that now plus it always fits an int64."""


def positive_ms(name: str, value: object) -> int:
    """``value`` if it is a positive int of milliseconds; else a ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_DURATION_MS:
        raise ValueError(
            f"{name} must be a positive int of milliseconds, at most {MAX_DURATION_MS}, "
            f"got {value!r}"
        )
    return value


Outcome: TypeAlias = Complete | Suspend
"""What an agent returns."""


def is_agent(candidate: object) -> bool:
    """Whether ``candidate`` is an agent: ``async def agent(ctx)``, or an object calling as one."""
    if inspect.iscoroutinefunction(candidate):
        return True
    if isinstance(candidate, type):
        return False
    return inspect.iscoroutinefunction(getattr(candidate, "__call__", None))  # noqa: B004


# -- deterministic identifiers ----------------------------------------------------------------
# uuid5_hex and hyphenated live with the wire contract, which the effector shares.
INTENT_NAMESPACE = uuid.UUID("396f639f-0714-5193-8a2d-3dad80bac0d8")
"""The uuid5 namespace of intent ids, fixed forever: the effector deduplicates on them."""


@functools.lru_cache(maxsize=256)
def namespace_uuid(namespace: str) -> uuid.UUID:
    """``uuid5(INTENT_NAMESPACE, "namespace:" + namespace)``, for ``AgentConfig.namespace``."""
    if not isinstance(namespace, str) or not namespace:
        raise ValueError(f"an intent namespace must be a non-empty str, got {namespace!r}")
    return uuid.uuid5(INTENT_NAMESPACE, f"namespace:{namespace}")


def intent_id_for(
    entity_key: bytes, seq: int, step_index: int, namespace: str | None = None
) -> str:
    """The id of the intent staged by run ``seq`` of ``entity_key`` at step ``step_index``.

    ``str(uuid5(INTENT_NAMESPACE, f"{entity_key.hex()}|{seq}|{step_index}"))`` without a
    namespace; with one, the same name under :func:`namespace_uuid` instead. A key's first run
    has ``seq == 0`` and its first step has ``step_index == 0``.
    """
    space = INTENT_NAMESPACE if namespace is None else namespace_uuid(namespace)
    return hyphenated(uuid5_hex(space, f"{entity_key.hex()}|{seq}|{step_index}"))


def epoch_clock() -> float:
    """The DirectRunner's ``TestStream`` clock as a ``DoFn`` sees it: always the epoch.

    ``RunAgent`` picks it by itself for input fed by a ``TestStream``.
    """
    return 0.0


# -- errors -----------------------------------------------------------------------------------
class ErrorReason(enum.StrEnum):
    """The machine-readable ``reason`` of an ``AgentError`` record on ``.errors``."""

    ACTIVATION_ERROR = "activation_error"
    """The agent raised (or returned something other than ``Complete``/``Suspend``)."""
    ACTIVATION_TIMEOUT = "activation_timeout"
    """The activation ran longer than ``AgentConfig.activation_timeout_s``."""
    ORPHANED_RESULT = "orphaned_result"
    """A tool result or approval that matches no pending intent; the detail says why."""
    STALE_APPROVAL = "stale_approval"
    """An approval decided on other arguments than its pending intent's (its ``args_digest``
    differs): not applied, the run keeps waiting."""
    MALFORMED_ELEMENT = "malformed_element"
    """The element is not a ``(bytes, AgentEnvelope)`` pair."""
    EMPTY_KEY = "empty_key"
    """The element's key is empty."""
    KEY_MISMATCH = "key_mismatch"
    """The element's key differs from its envelope's ``entity_key``."""
    MISSING_PAYLOAD = "missing_payload"
    """The envelope carries no event, tool result or approval."""
    BUFFER_OVERFLOW = "buffer_overflow"
    """An external event arrived for a suspended key whose event buffer was full."""
    SUSPENSION_DROPPED = "suspension_dropped"
    """A suspended run reached its deadline and its timeout route was ``Drop``."""
    SUSPENSION_WIPED = "suspension_wiped"
    """A suspended run was discarded by idle-key cleanup before it was resumed."""
    TIMEOUT_ROUTE_ERROR = "timeout_route_error"
    """The HITL ``on_timeout`` route raised or returned something that is not a route."""
    MODEL_ERROR = "model_error"
    """A model call failed for good and the agent let the ``ProviderError`` escape: retries
    exhausted, an error that is not retried (a bad request, an undecodable body), or the
    endpoint's circuit open. Nothing was committed; the envelope can be re-driven."""
    BUDGET_EXCEEDED = "budget_exceeded"
    """The run's model calls went past ``AgentConfig.max_tokens_per_run`` (resumes included).
    Nothing was committed; re-driving fails the same way unless the budget is raised."""


class AgentRuntimeError(Exception):
    """Base class of the errors the activation context raises."""


class StateSchemaError(AgentRuntimeError):
    """A state blob was written by a newer schema version than this code understands."""


class MemoryLimitError(AgentRuntimeError, ValueError):
    """A working-memory write would take the key's memory past its size cap."""


class MemorySlotError(AgentRuntimeError, TypeError):
    """A working-memory call used a bad key or value, or the wrong kind of slot."""


class ModelNotConfiguredError(AgentRuntimeError):
    """The agent called the model but ``AgentConfig.provider_factory`` is not set."""


class InvalidOutcomeError(AgentRuntimeError, TypeError):
    """The agent returned something that is not a valid ``Complete`` or ``Suspend``."""


class BudgetExceededError(AgentRuntimeError):
    """The run went past ``AgentConfig.max_tokens_per_run``; the activation fails even if caught."""


class BudgetExceeded(AgentRuntimeError):
    """A fleet budget (``AgentConfig.budget``) has nothing left; raised before the provider call.

    The agent may catch it and go on; uncaught, the activation fails as ``budget_exceeded``.
    """

    def __init__(self, message: str, *, ledger: str = "", window_start_ms: int = 0) -> None:
        super().__init__(message)
        self.ledger = ledger
        """The budget's ledger (``Budget.name``, or ``name/tenant``)."""
        self.window_start_ms = window_start_ms
        """The start of the exhausted window (Unix ms)."""


class ActivationTimeoutError(AgentRuntimeError, TimeoutError):
    """The activation did not finish within ``AgentConfig.activation_timeout_s``."""


class ReadOnlyIntentError(ToolError):
    """``ctx.act`` named a read-only tool, which runs inline with ``ctx.run_tool`` instead."""


class CompensationError(AgentRuntimeError, ValueError):
    """``ctx.compensate`` was given an intent it cannot compensate; ``intent_id`` names it."""

    def __init__(self, message: str, *, intent_id: str) -> None:
        super().__init__(message)
        self.intent_id = intent_id


# -- driving an agent's coroutine from a synchronous DoFn -------------------------------------
# The driver steps a coroutine inline first and continues it on an event loop it owns only if
# it waits on something (docs/concepts/runtime.md, "Driving coroutines").
T = TypeVar("T")


class _EnterTask:
    """Yielded by :func:`enter_task` outside a task: the driver continues in its task at once."""

    __slots__ = ()

    def __await__(self) -> Generator[Any, Any, None]:
        yield self


_ENTER_TASK = _EnterTask()


async def enter_task() -> None:
    """Make sure what follows runs inside an ``asyncio.Task`` (an inline step runs in none)."""
    if asyncio.current_task() is None:
        await _ENTER_TASK


class _Continue(Generic[T]):
    """An awaitable that carries on a coroutine already stepped once outside the loop."""

    __slots__ = ("_coroutine", "_yielded")

    def __init__(self, coroutine: Coroutine[Any, Any, T], yielded: Any) -> None:
        self._coroutine = coroutine
        self._yielded = yielded

    def __await__(self) -> Generator[Any, Any, T]:
        coroutine, yielded = self._coroutine, self._yielded
        while True:
            if yielded is _ENTER_TASK:
                sent = None  # now inside the task: nothing to wait for
            else:
                try:
                    sent = yield yielded
                except BaseException as exc:  # cancellation must reach the agent too
                    try:
                        yielded = coroutine.throw(exc)
                    except StopIteration as stop:
                        return stop.value  # type: ignore[no-any-return]
                    continue
            try:
                yielded = coroutine.send(sent)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]


class CoroutineDriver:
    """Runs coroutines to completion on an event loop it owns, stepping them inline first."""

    __slots__ = ("_deadline", "_loop")

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._deadline = 0.0

    def time_left_s(self) -> float:
        """Seconds left before the coroutine being run times out (negative once it has)."""
        return self._deadline - time.monotonic()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run ``coroutine`` to completion; raise ``ActivationTimeoutError`` after ``timeout_s``."""
        started = time.monotonic()
        self._deadline = started + timeout_s
        previous_loop = asyncio._get_running_loop()
        asyncio._set_running_loop(self._loop)
        try:
            yielded = coroutine.send(None)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        finally:
            asyncio._set_running_loop(previous_loop)
        remaining = timeout_s - (time.monotonic() - started)
        if remaining <= 0:
            coroutine.close()
            raise ActivationTimeoutError(f"the activation did not finish within {timeout_s}s")
        return self._loop.run_until_complete(self._finish(coroutine, yielded, remaining, timeout_s))

    @staticmethod
    async def _finish(
        coroutine: Coroutine[Any, Any, T], yielded: Any, remaining_s: float, timeout_s: float
    ) -> T:
        try:
            async with asyncio.timeout(remaining_s):
                return await _Continue(coroutine, yielded)
        except TimeoutError:
            raise ActivationTimeoutError(
                f"the activation did not finish within {timeout_s}s"
            ) from None

    def close(self) -> None:
        """Close the loop, cancelling anything still scheduled on it."""
        if self._loop.is_closed():
            return
        leftovers = asyncio.all_tasks(self._loop)
        for task in leftovers:
            task.cancel()
        if leftovers:
            self._loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()
