"""The worker: claims runnable intents, executes each once, records and publishes its result.

Per intent: claim with a lease, settle a compensation or ask a possibly started intent's
reconciler, execute it with :class:`EffectorToolRunner`, then record the result with its envelope
and claim work for the slots the results free. A failing store is retried with growing waits.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import inspect
import json
import logging
import os
import queue
import socket
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import effector.observability as audit
from beam_agents._protos import ToolIntent, ToolResult, canonical_json_bytes, withdrawal_id_for
from beam_agents.tools import IntentInfo, Reconciled, Tool, ToolRegistry
from beam_agents.tools.errors import ToolArgumentError, ToolNotFoundError
from effector.observability import EffectorMetrics
from effector.store.budgets import parse_debit
from effector.store.errors import EffectorError, StoreError
from effector.store.intents import (
    Claim,
    ClaimBatch,
    ClaimRequest,
    Completion,
    encodable_text,
    expired_result,
    intent_id_problem,
    late_original_reason,
    new_result,
    rejected_result,
    wall_clock_ms,
)
from effector.store.sql import SqlStore

_log = logging.getLogger(__name__)
_T = TypeVar("_T")


class ToolRefusedError(EffectorError):
    """The effector refused to run a tool at all (it is read-only, or lacks what it needs)."""


class ToolTimeoutError(EffectorError, TimeoutError):
    """A tool did not finish within the effector's per-call timeout."""


# -- validating and running one intent's tool ---------------------------------------------------


MAX_ERROR_MESSAGE_CHARS = 4_096
"""Error messages in results are cut to this length, so one failure cannot bloat the log."""
MAX_RESULT_PAYLOAD_BYTES = 3 * 1024 * 1024
"""The largest return value a result carries: its envelope stays under Publish's envelope cap,
so every Read answer can deliver it. A tool returning more fails (ERROR)."""


class IntentRejectedError(Exception):
    """An intent cannot be executed as written; the message is the recorded reason."""


def parse_arguments(args_json: str) -> Any:
    """Decode ``args_json``; empty text means no arguments. Raises ``ValueError`` if not JSON.

    JSON nested too deeply for the decoder is a ``ValueError`` too, not a ``RecursionError``.
    """
    if not args_json:
        return {}
    try:
        return json.loads(args_json)
    except RecursionError:
        raise ValueError("it nests too deeply to decode") from None


def prepare_call(
    registry: ToolRegistry, intent: ToolIntent
) -> tuple[Tool[..., Any], dict[str, Any]]:
    """Resolve a TOOL intent to its tool and validated keyword arguments, or raise why not."""
    try:
        tool = registry.get(intent.tool_name)
    except ToolNotFoundError:
        raise IntentRejectedError(f"unknown tool {intent.tool_name[:128]!r}") from None
    if not tool.side_effect:
        raise IntentRejectedError(_read_only_refusal(tool).args[0])
    try:
        arguments = parse_arguments(intent.args_json)
    except ValueError as exc:
        raise IntentRejectedError(f"args_json for tool {tool.name!r} is not JSON: {exc}") from None
    if not isinstance(arguments, dict):
        raise IntentRejectedError(
            f"args_json for tool {tool.name!r} must be a JSON object, "
            f"not {type(arguments).__name__}"
        )
    try:
        return tool, tool.validate_arguments(arguments)
    except ToolArgumentError as exc:
        raise IntentRejectedError(str(exc)) from None
    except Exception as exc:  # a validator of the tool's own that raised something else
        raise IntentRejectedError(
            f"arguments for tool {tool.name!r} could not be validated: {error_text(exc)}"
        ) from None


PreparedCall = tuple[Tool[..., Any], dict[str, Any]]
"""A TOOL intent's tool and validated keyword arguments, as :func:`prepare_call` returns them."""


def intake_rejection(registry: ToolRegistry, intent: ToolIntent) -> str | None:
    """Why a well-identified intent must be recorded as REJECTED, or ``None`` if it is valid.

    Only a TOOL intent may carry compensation fields; an effect whose undo could not run is
    refused before it runs.
    """
    return screen_intent(registry, intent)[0]


def screen_intent(
    registry: ToolRegistry, intent: ToolIntent
) -> tuple[str | None, PreparedCall | None]:
    """:func:`intake_rejection`, and a valid TOOL intent's prepared call (else ``None``)."""
    prepared = None
    if intent.kind == ToolIntent.TOOL:
        try:
            prepared = prepare_call(registry, intent)
        except IntentRejectedError as exc:
            return str(exc), None
    elif intent.kind == ToolIntent.APPROVAL:
        try:
            parse_arguments(intent.args_json)
        except ValueError as exc:
            return f"args_json of approval intent is not JSON: {exc}", None
    elif intent.kind == ToolIntent.WITHDRAWAL:
        return withdrawal_problem(intent), None
    elif intent.kind == ToolIntent.BUDGET_DEBIT:
        try:
            parse_debit(intent)
        except ValueError as exc:
            return str(exc), None
        return None, None
    else:
        return f"unknown intent kind {int(intent.kind)}", None
    return _linked_intent_problem(registry, intent), prepared


def _linked_intent_problem(registry: ToolRegistry, intent: ToolIntent) -> str | None:
    """Why a TOOL or APPROVAL intent's withdrawal, expiry or compensation fields are refused."""
    if intent.withdraws_intent_id:
        return "only a WITHDRAWAL intent may set withdraws_intent_id"
    if intent.policy_gate_for or intent.policy_rule:
        return "policy_gate_for and policy_rule are set by the effector's policy, never by a client"
    expires_at_ms, created_at_ms = intent.expires_at_ms, intent.created_at_ms
    if expires_at_ms != 0 and expires_at_ms < created_at_ms:
        return f"expires_at_ms ({expires_at_ms}) precedes created_at_ms ({created_at_ms})"
    linked = bool(intent.compensate_tool or intent.compensate_args_json)
    compensates = intent.compensates_intent_id
    if not (linked or compensates):
        return None
    if intent.kind != ToolIntent.TOOL:
        return "only a TOOL intent may compensate or be compensated"
    if compensates:
        problem = intent_id_problem(compensates)
        if problem is not None:
            return f"compensates_intent_id: {problem}"
        if compensates == intent.intent_id:
            return "an intent cannot compensate itself"
        if linked:
            return "a compensating intent cannot itself have a compensation"
        return None
    undo = ToolIntent(tool_name=intent.compensate_tool, args_json=intent.compensate_args_json)
    try:
        prepare_call(registry, undo)
    except IntentRejectedError as exc:
        return f"its compensation cannot run: {exc}"
    return None


def withdrawal_problem(withdrawal: ToolIntent) -> str | None:
    """Why a WITHDRAWAL intent is malformed, or ``None`` (the store checks its target's key)."""
    target = withdrawal.withdraws_intent_id
    problem = intent_id_problem(target)
    if problem is not None:
        return f"withdraws_intent_id: {problem}"
    expected = withdrawal_id_for(target)
    if withdrawal.intent_id != expected:
        return (
            f"a withdrawal of intent {target} must have the id withdrawal_id_for({target}) = "
            f"{expected}, not {withdrawal.intent_id}"
        )
    try:
        arguments = parse_arguments(withdrawal.args_json)
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict) or set(arguments) != {"reason"}:
        return 'args_json of a withdrawal must be a JSON object {"reason": "..."}'
    if not isinstance(arguments["reason"], str):
        return "the reason of a withdrawal must be a string"
    linked = withdrawal.compensate_tool or withdrawal.compensate_args_json
    if linked or withdrawal.compensates_intent_id:
        return "only a TOOL intent may compensate or be compensated"
    return None


def _read_only_refusal(tool: Tool[..., Any]) -> ToolRefusedError:
    return ToolRefusedError(
        f"tool {tool.name!r} is read-only (side_effect=False): it runs inline in the pipeline "
        f"through ToolRunner, never in the effector"
    )


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One validated call of a side-effecting tool, for :meth:`EffectorToolRunner.execute_batch`."""

    intent: ToolIntent
    tool: Tool[..., Any]
    kwargs: dict[str, Any]
    attempt: int


CallFinished = Callable[[int, ToolResult | None, float], None]
"""Told, for one call of a batch, its index, its result and the seconds it took; ``None`` for a
call cancelled by something other than the batch's deadline (a drain, or the tool itself)."""


class EffectorToolRunner:
    """Runs ``side_effect=True`` tools, validated, with ``intent`` injected, under a timeout."""

    def __init__(self, tool_timeout_ms: int = 30_000) -> None:
        if isinstance(tool_timeout_ms, bool) or not isinstance(tool_timeout_ms, int):
            raise TypeError(f"tool_timeout_ms must be an int, got {type(tool_timeout_ms).__name__}")
        if tool_timeout_ms <= 0:
            raise ValueError(f"tool_timeout_ms must be positive, got {tool_timeout_ms}")
        self._timeout_ms = tool_timeout_ms
        self._threads = _ToolThreads()

    @property
    def tool_timeout_ms(self) -> int:
        """How long one tool call may take before it counts as failed."""
        return self._timeout_ms

    async def run(
        self,
        tool: Tool[..., Any],
        arguments: Mapping[str, Any],
        intent_info: IntentInfo | None = None,
    ) -> Any:
        """Validate ``arguments`` and run the side-effecting ``tool``; return its result.

        Raises ``ToolRefusedError`` for a read-only tool or one that needs ``intent_info``,
        ``ToolArgumentError``, ``ToolTimeoutError``, or whatever the tool raises.
        """
        if not isinstance(tool, Tool):
            raise TypeError(f"EffectorToolRunner.run takes a Tool, got {type(tool).__name__}")
        if not tool.side_effect:
            raise _read_only_refusal(tool)
        return await self._call(tool, tool.validate_arguments(arguments), intent_info)

    async def execute(
        self, registry: ToolRegistry, intent: ToolIntent, *, attempt: int, clock: Callable[[], int]
    ) -> ToolResult:
        """Execute one attempt of a TOOL intent and map the outcome to its ``ToolResult``."""
        if intent.kind != ToolIntent.TOOL:
            raise ValueError(f"only TOOL intents are executed; {intent.intent_id} is not one")
        try:
            tool, kwargs = prepare_call(registry, intent)
        except IntentRejectedError as exc:
            audit.rejected(intent, str(exc))
            return rejected_result(intent, str(exc), now_ms=clock())
        call = ToolCall(intent, tool, kwargs, attempt)
        return await _result_of(call, clock, lambda: self._call(tool, kwargs, _intent_info(call)))

    def execute_batch(
        self, calls: Sequence[ToolCall], clock: Callable[[], int], finished: CallFinished
    ) -> list[asyncio.Task[ToolResult]]:
        """Start every call now; ``finished`` hears of each once it ends, with its result.

        Each call's first step runs here, in a task of its own started eagerly: a call that
        does not suspend (an async no-op) is finished before this returns, with no timer and
        no thread hop. The calls that suspend run on under one deadline, this batch's start
        plus the tool timeout; each still running then ends as a timeout. Sync tools run on
        pool threads. Returns the tasks still running.
        """
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        running: dict[asyncio.Task[ToolResult], int] = {}
        for index, call in enumerate(calls):
            call_started = time.perf_counter()
            task = _start_eagerly(loop, self._attempt(call, clock))
            if task.done():  # cancelled only if the tool raised CancelledError itself
                result = None if task.cancelled() else _task_result(task, call, clock)
                finished(index, result, time.perf_counter() - call_started)
            else:
                running[task] = index
        if not running:
            return []
        expired: set[asyncio.Task[ToolResult]] = set()

        def ended(task: asyncio.Task[ToolResult]) -> None:
            index = running[task]
            result: ToolResult | None
            if not task.cancelled():
                result = _task_result(task, calls[index], clock)
            elif task in expired:
                call = calls[index]
                message = f"tool {call.tool.name!r} did not finish within {self._timeout_ms} ms"
                result = _failed(call, ToolTimeoutError(message), clock())
            else:
                result = None
            finished(index, result, time.perf_counter() - started)

        def expire() -> None:
            for task in running:
                if not task.done():
                    expired.add(task)
                    task.cancel()

        deadline = loop.call_at(loop.time() + self._timeout_ms / 1000, expire)
        remaining = len(running)

        def count_down(_: asyncio.Task[ToolResult]) -> None:
            nonlocal remaining
            remaining -= 1
            if not remaining:
                deadline.cancel()

        for task in running:
            task.add_done_callback(ended)
            task.add_done_callback(count_down)
        return list(running)

    async def _attempt(self, call: ToolCall, clock: Callable[[], int]) -> ToolResult:
        """One call of a batch, its outcome mapped to a result (a timeout cancels it)."""

        def start() -> Awaitable[Any]:
            info = _intent_info(call) if call.tool.accepts_intent else None
            return self._unbounded(call.tool, call.kwargs, info)

        return await _result_of(call, clock, start)

    async def _call(
        self, tool: Tool[..., Any], kwargs: dict[str, Any], intent_info: IntentInfo | None
    ) -> Any:
        try:
            async with asyncio.timeout(self._timeout_ms / 1000) as scope:
                return await self._unbounded(tool, kwargs, intent_info)
        except TimeoutError:
            if scope.expired():
                raise ToolTimeoutError(
                    f"tool {tool.name!r} did not finish within {self._timeout_ms} ms"
                ) from None
            raise

    def _unbounded(
        self, tool: Tool[..., Any], kwargs: dict[str, Any], intent_info: IntentInfo | None
    ) -> Awaitable[Any]:
        """The call of ``tool``: a coroutine on this loop, or a pool thread for a sync tool."""
        if tool.accepts_intent:
            if intent_info is None:
                raise ToolRefusedError(
                    f"tool {tool.name!r} declares intent: IntentInfo; run it with intent_info"
                )
            kwargs = {**kwargs, "intent": intent_info}
        function = tool.unwrap()
        return self._invoke(function, kwargs, _is_async(function))

    async def reconcile(
        self, tool: Tool[..., Any], kwargs: dict[str, Any], intent_info: IntentInfo
    ) -> Reconciled | None:
        """Ask ``tool``'s reconciler whether the intent's effect happened, under the timeout."""
        reconciler = tool.reconcile_with
        if reconciler is None:
            raise ValueError(f"tool {tool.name!r} has no reconciler")
        call = functools.partial(reconciler, intent_info, dict(kwargs))
        what = f"the reconciler of tool {tool.name!r}"
        try:
            async with asyncio.timeout(self._timeout_ms / 1000) as scope:
                answer = await self._invoke(call, {}, inspect.iscoroutinefunction(reconciler))
        except TimeoutError:
            if scope.expired():
                raise ToolTimeoutError(
                    f"{what} did not finish within {self._timeout_ms} ms"
                ) from None
            raise
        if answer is not None and not isinstance(answer, Reconciled):
            raise TypeError(f"{what} returned {type(answer).__name__}, not Reconciled or None")
        return answer

    async def _invoke(
        self, function: Callable[..., Any], kwargs: dict[str, Any], is_async: bool
    ) -> Any:
        """``function(**kwargs)``: async on this loop, sync on a pool thread."""
        if is_async:
            value = function(**kwargs)
        else:
            value = await self._threads.call(function, kwargs)
        if inspect.isawaitable(value):
            value = await value
        return value


async def _result_of(
    call: ToolCall, clock: Callable[[], int], start: Callable[[], Awaitable[Any]]
) -> ToolResult:
    """The result of ``call``, run by awaiting what ``start`` returns; failures become ERROR."""
    try:
        value = await start()
    # A tool that calls sys.exit() is a failed tool, not a request to stop the effector.
    except (Exception, SystemExit) as exc:
        return _failed(call, exc, clock())
    except asyncio.CancelledError as exc:
        if _cancelled_from_outside():
            raise
        return _failed(call, exc, clock())
    return _returned(call, value, clock())


def _cancelled_from_outside() -> bool:
    """Whether the running task was asked to cancel (a deadline, a drain), not by its tool.

    A tool that raises ``CancelledError`` without being cancelled failed: its result is ERROR.
    """
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


def _task_result(
    task: asyncio.Task[ToolResult], call: ToolCall, clock: Callable[[], int]
) -> ToolResult:
    """A finished (not cancelled) call's result; ERROR if the tool raised past ``_attempt``."""
    try:
        return task.result()
    except BaseException as exc:  # e.g. a BaseException subclass of the tool's own
        return _failed(call, exc, clock())


@functools.lru_cache(maxsize=1024)
def _is_async(function: Callable[..., Any]) -> bool:
    """Whether a tool's function is a coroutine function (``@tool`` wraps only functions)."""
    return inspect.iscoroutinefunction(function)


def _intent_info(call: ToolCall) -> IntentInfo:
    intent = call.intent
    return IntentInfo(
        intent_id=intent.intent_id,
        entity_key=intent.entity_key,
        seq=intent.seq,
        step_index=intent.step_index,
        attempt=call.attempt,
    )


def _returned(call: ToolCall, value: Any, now_ms: int) -> ToolResult:
    """The OK result carrying ``value``; ERROR if no result can carry it."""
    try:
        payload = _encode(call.tool, value)
    except _UnsendableResultError as exc:
        return _failed(call, exc, now_ms)
    return new_result(
        call.intent, ToolResult.OK, completed_at_ms=now_ms, attempt=call.attempt, payload=payload
    )


def _failed(call: ToolCall, error: BaseException, now_ms: int) -> ToolResult:
    """The ERROR result of a call that raised ``error`` (or timed out), logged once."""
    failed = new_result(
        call.intent,
        ToolResult.ERROR,
        completed_at_ms=now_ms,
        attempt=call.attempt,
        error_message=_describe(error)[:MAX_ERROR_MESSAGE_CHARS],
    )
    audit.tool_failed(call.intent, failed, error)
    return failed


if sys.version_info >= (3, 12):

    def _start_eagerly(
        loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, _T]
    ) -> asyncio.Task[_T]:
        """A task running ``coroutine``, whose first step has run before this returns."""
        return asyncio.Task(coroutine, loop=loop, eager_start=True)

else:

    def _start_eagerly(
        loop: asyncio.AbstractEventLoop, coroutine: Coroutine[Any, Any, _T]
    ) -> asyncio.Task[_T]:
        """A task running ``coroutine``, whose first step has run before this returns.

        Python 3.11 has no eager tasks: the step a new task scheduled is taken off the loop's
        ready queue and run here, as the task (the one calling this steps aside meanwhile),
        so the coroutine sees its own task as current. A loop without that queue (not
        asyncio's own) runs the step later, as usual.
        """
        ready = getattr(loop, "_ready", None)
        queued = len(ready) if isinstance(ready, collections.deque) else -1
        task = asyncio.Task(coroutine, loop=loop)
        if queued < 0 or len(ready) != queued + 1:  # type: ignore[arg-type]
            return task
        step = ready.pop()  # type: ignore[union-attr]
        current = asyncio.current_task(loop)
        if current is not None:
            asyncio.tasks._leave_task(loop, current)
        try:
            step._run()
        finally:
            if current is not None:
                asyncio.tasks._enter_task(loop, current)
        return task


class _UnsendableResultError(Exception):
    """A tool's return value that no result can carry: not JSON, or too large."""


def _encode(tool: Tool[..., Any], value: Any) -> bytes:
    if value is None:
        return b"null"  # what most side-effecting tools return
    try:
        payload = canonical_json_bytes(value)
    except Exception as exc:  # the value's own methods may raise anything
        raise _UnsendableResultError(
            f"tool {tool.name!r} returned a value that is not JSON-encodable: {error_text(exc)}"
        ) from None
    if len(payload) > MAX_RESULT_PAYLOAD_BYTES:
        raise _UnsendableResultError(
            f"tool {tool.name!r} returned {len(payload)} bytes of JSON, over the cap of "
            f"{MAX_RESULT_PAYLOAD_BYTES} a result may carry; return a reference to the data instead"
        )
    return payload


def _describe(exc: BaseException) -> str:
    if isinstance(exc, (ToolTimeoutError, _UnsendableResultError)):
        return str(exc)
    return error_text(exc)


def error_text(exc: BaseException) -> str:
    """``Type: message`` of ``exc``, encodable; also for an exception whose ``str`` raises."""
    try:
        message = str(exc)
    except Exception as failure:  # the exception's own __str__ failed
        message = f"<its message could not be read: {type(failure).__name__}>"
    return encodable_text(f"{type(exc).__name__}: {message}")


class _Inbox:
    """What pool threads finished for one event loop, handed over with one wake-up per batch."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # weak: the pool's table of inboxes is keyed by it
        self._lock = threading.Lock()
        self._finished: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []

    def put(self, future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
        """From a pool thread: settle ``future`` on its loop with ``value`` or ``error``."""
        with self._lock:
            first = not self._finished
            self._finished.append((future, value, error))
        loop = self._loop()
        if first and loop is not None:
            # A closed loop means the call was abandoned at shutdown; nobody waits for it.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            finished, self._finished = self._finished, []
        for future, value, error in finished:
            if future.done():  # the caller gave up (its timeout)
                continue
            if error is None:
                future.set_result(value)
            else:  # never StopIteration, which a future refuses: the job converted it
                future.set_exception(error)


class _ToolThreads:
    """Daemon threads that run sync tools: an idle one is reused, otherwise another starts."""

    _IDLE_EXIT_S = 60.0

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._inboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Inbox] = (
            weakref.WeakKeyDictionary()
        )

    def call(self, function: Callable[..., Any], kwargs: dict[str, Any]) -> asyncio.Future[Any]:
        """Run ``function(**kwargs)`` on a pool thread; the future settles on this loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()
        inbox = self._inboxes.get(loop)
        if inbox is None:
            inbox = self._inboxes[loop] = _Inbox(loop)

        def job() -> None:
            value: Any = None
            error: BaseException | None = None
            try:
                value = function(**kwargs)
            except StopIteration as exc:  # a future cannot carry it: asyncio refuses to set it
                error = RuntimeError(f"the tool raised {error_text(exc)}")
            except BaseException as exc:  # delivered to the awaiting task, which classifies it
                error = exc
            inbox.put(future, value, error)

        with self._lock:
            start_thread = self._idle == 0
            if not start_thread:
                self._idle -= 1
        self._jobs.put(job)
        if start_thread:
            threading.Thread(target=self._serve, name="effector-tool", daemon=True).start()
        return future

    def _serve(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self._IDLE_EXIT_S)
            except queue.Empty:
                with self._lock:
                    # Zero idle means a caller counted on this thread and its job is queued.
                    if self._idle > 0:
                        self._idle -= 1
                        return
                continue
            job()
            with self._lock:
                self._idle += 1


# -- reconcile before re-executing --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Found:
    """The reconciler found the effect: record ``result`` (OK, its value) without executing."""

    result: ToolResult


@dataclass(frozen=True, slots=True)
class NotFound:
    """The reconciler says the effect did not happen: execute, or record ``expired`` if set."""

    expired: ToolResult | None = None


@dataclass(frozen=True, slots=True)
class InDoubt:
    """The reconciler failed: leave the intent IN_DOUBT, asking again after ``retry_in_ms``."""

    reason: str
    retry_in_ms: int


Settlement = Found | NotFound | InDoubt


def retry_delay_ms(failures: int) -> int:
    """The IN_DOUBT backoff after ``failures`` failures in a row: 1 s, doubling, at most 5 min."""
    return round(retry_delay_s(failures, initial_s=1.0, cap_s=300.0) * 1000)


async def ask_reconciler(
    runner: EffectorToolRunner,
    registry: ToolRegistry,
    claim: Claim,
    clock: Callable[[], int],
) -> Settlement | None:
    """Ask the reconciler of a possibly started claim's tool what became of its effect.

    ``None`` when there is nothing to ask. An intent past its deadline is never executed:
    ``NotFound`` with its EXPIRED result.
    """
    if not claim.possibly_started:
        return None
    intent = claim.intent
    try:
        tool, kwargs = prepare_call(registry, intent)
    except IntentRejectedError:
        return None
    if tool.reconcile_with is None:
        return _not_found(claim, clock()) if _past_deadline(claim, clock()) else None
    info = IntentInfo(
        intent.intent_id, intent.entity_key, intent.seq, intent.step_index, claim.attempt
    )
    try:
        answer = await runner.reconcile(tool, kwargs, info)
        payload = None if answer is None else _encode(tool, answer.value)
    # A reconciler that calls sys.exit() failed; it does not stop the effector.
    except (Exception, SystemExit) as exc:
        reason = error_text(exc)[:MAX_ERROR_MESSAGE_CHARS]
        delay_ms = retry_delay_ms(claim.reconcile_failures + 1)
        audit.in_doubt(intent, claim.attempt, reason, delay_ms)
        return InDoubt(reason, delay_ms)
    now_ms = clock()
    if payload is None:
        return _not_found(claim, now_ms)
    audit.reconciled(intent, claim.attempt)
    return Found(
        new_result(
            intent, ToolResult.OK, completed_at_ms=now_ms, attempt=claim.attempt, payload=payload
        )
    )


def _past_deadline(claim: Claim, now_ms: int) -> bool:
    return bool(claim.deadline_ms) and now_ms > claim.deadline_ms


def _not_found(claim: Claim, now_ms: int) -> NotFound:
    """Execute; or, past the deadline, record EXPIRED (counting the interrupted attempts)."""
    if not _past_deadline(claim, now_ms):
        return NotFound()
    return NotFound(expired_result(claim.intent, now_ms=now_ms, attempts=claim.attempt - 1))


# -- backing off from a failing store -----------------------------------------------------------

INITIAL_RETRY_S = 0.5
MAX_RETRY_S = 10.0


def retry_delay_s(
    failures: int, *, initial_s: float = INITIAL_RETRY_S, cap_s: float = MAX_RETRY_S
) -> float:
    """The wait after the ``failures``-th failure in a row (from 1): doubling, capped."""
    if failures < 1:
        raise ValueError(f"failures counts from 1, got {failures}")
    return min(cap_s, initial_s * 2.0 ** min(failures - 1, 64))


class StoreOutage:
    """Consecutive store failures per operation, their retry waits, and the recovery line."""

    def __init__(
        self,
        *,
        initial_s: float = INITIAL_RETRY_S,
        cap_s: float = MAX_RETRY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._initial_s = initial_s
        self._cap_s = cap_s
        self._clock = clock
        self._failures: dict[str, int] = {}
        """Consecutive failures of each operation that is failing now."""
        self._started: float | None = None
        self._failed_attempts = 0

    @property
    def failing(self) -> bool:
        """Whether some operation failed and has not succeeded since."""
        return bool(self._failures)

    def failed(self, operation: str, error: BaseException) -> float:
        """Count a failure of ``operation`` and log it; returns the seconds to wait to retry."""
        failures = self._failures.get(operation, 0) + 1
        self._failures[operation] = failures
        self._failed_attempts += 1
        if self._started is None:
            self._started = self._clock()
        delay = retry_delay_s(failures, initial_s=self._initial_s, cap_s=self._cap_s)
        _log.warning(
            "%s failed (%d in a row), retrying in %.1f s: %s", operation, failures, delay, error
        )
        return delay

    def succeeded(self, operation: str) -> None:
        """Note that ``operation`` worked; once every failing one has, log the recovery."""
        if self._failures.pop(operation, None) is None or self._failures:
            return
        assert self._started is not None
        _log.info(
            "store recovered after %.1f s / %d failed attempts",
            self._clock() - self._started,
            self._failed_attempts,
        )
        self._started = None
        self._failed_attempts = 0


# -- the worker ---------------------------------------------------------------------------------

_APPROVAL_EXPIRY_BATCH = 1_000
COMMITS_IN_FLIGHT = 2
"""Commits of results a worker has in flight at once: one records while the next gathers."""
VALIDATED_CALLS_KEPT = 65_536
"""How many intents' prepared calls (see :meth:`Worker.keep_validated`) a worker keeps."""
VALIDATED_ARGS_BYTES_KEPT = 8 * 1024 * 1024
"""The most argument JSON whose prepared calls a worker keeps (validated values weigh more)."""
VALIDATED_ARGS_BYTES_EACH = 16 * 1024
"""An intent with more argument JSON than this is validated again when it runs, not kept."""


class _ValidatedCalls:
    """Calls Submit prepared, by intent id, oldest let go first, bounded in count and bytes."""

    def __init__(self) -> None:
        self._calls: collections.OrderedDict[str, tuple[PreparedCall, int]] = (
            collections.OrderedDict()
        )
        self._bytes = 0

    def keep(self, intent_id: str, prepared: PreparedCall, args_bytes: int) -> None:
        """Keep ``prepared`` unless its arguments are too large; let the oldest go if full."""
        if args_bytes > VALIDATED_ARGS_BYTES_EACH or intent_id in self._calls:
            return
        self._calls[intent_id] = (prepared, args_bytes)
        self._bytes += args_bytes
        while len(self._calls) > VALIDATED_CALLS_KEPT or self._bytes > VALIDATED_ARGS_BYTES_KEPT:
            _, (_, weight) = self._calls.popitem(last=False)
            self._bytes -= weight

    def take(self, intent_id: str) -> PreparedCall | None:
        """The call kept for ``intent_id``, no longer kept; ``None`` if there is none."""
        kept = self._calls.pop(intent_id, None)
        if kept is None:
            return None
        self._bytes -= kept[1]
        return kept[0]

    def __len__(self) -> int:
        return len(self._calls)


DEFAULT_TELEMETRY_RETENTION_MS = 7 * 24 * 3_600_000


GAUGE_COUNT_SHARE = 0.02
"""The most of the time the gauges' count may take: after a count that took T, the next waits
T / this (at most ``GAUGE_COUNT_WAIT_MAX_S``)."""
GAUGE_COUNT_WAIT_MAX_S = 30.0
"""The longest the gauges go uncounted, however slow one count was (a stall, not the count)."""


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """How the worker paces itself; every duration is in milliseconds."""

    concurrency: int = 64
    """Intents executed at once (each of a different key); 0 makes an ingest-only replica."""
    lease_ms: int = 30_000
    """How long a claim stays valid without renewal; renewed every third of it."""
    result_retention_ms: int = 7 * 24 * 3_600_000
    """DONE intents and envelopes older than this may be pruned (dedup holds within it)."""
    poll_interval_ms: int = 100
    """The longest the worker sleeps before looking for work it was not told about."""
    housekeeping_interval_ms: int = 1_000
    """How often approvals are expired, leases renewed and gauges refreshed."""

    def __post_init__(self) -> None:
        if self.concurrency < 0:
            raise ValueError(f"concurrency must not be negative, got {self.concurrency}")
        for name in (
            "lease_ms",
            "result_retention_ms",
            "poll_interval_ms",
            "housekeeping_interval_ms",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


class Worker:
    """Executes the intents of one store; see the module docstring for the phase order."""

    def __init__(
        self,
        store: SqlStore,
        registry: ToolRegistry,
        runner: EffectorToolRunner,
        metrics: EffectorMetrics,
        settings: WorkerSettings,
        *,
        owner: str | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        telemetry_retention_ms: int = DEFAULT_TELEMETRY_RETENTION_MS,
    ) -> None:
        if telemetry_retention_ms <= 0:
            raise ValueError(
                f"telemetry_retention_ms must be positive, got {telemetry_retention_ms}"
            )
        self._telemetry_retention_ms = telemetry_retention_ms
        self._store = store
        self._registry = registry
        self._runner = runner
        self._metrics = metrics
        self._settings = settings
        self._owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._clock = clock
        self._claims: dict[str, Claim] = {}
        self._reserved = 0
        """Slots promised to claim transactions in progress, not yet in ``_claims``."""
        self._unstarted: list[Claim] = []
        """Claims a commit made as a drain began: given back at its end, never run."""
        self._abandoned_commits: list[asyncio.Future[tuple[list[bool], ClaimBatch]]] = []
        """Record-and-claim commits left running when a drain gave up waiting for them."""
        self._executing = 0
        """Claims started whose result is not yet in hand."""
        self._executions: set[asyncio.Task[Any]] = set()
        self._wake = asyncio.Event()
        self._stopping = False
        self._stopped = asyncio.Event()
        """Set by :meth:`drain`: ends a claim loop waiting out a store outage."""
        self._outage = StoreOutage()
        self._outbox: list[tuple[Completion, asyncio.Future[bool] | None]] = []
        """Results not yet handed to the store; a future where someone awaits the answer."""
        self._commits: set[asyncio.Task[None]] = set()
        """The commits recording results now (at most ``COMMITS_IN_FLIGHT``)."""
        self._commit_starting = False
        """A commit task has been made that has not yet taken the outbox."""
        self._recording: set[str] = set()
        """The tokens of the claims whose results are in a commit in flight."""
        self._gave_up_recording = False
        """Set when a drain gave up waiting for the store: no commit starts after that."""
        self._validated = _ValidatedCalls()
        """The calls Submit prepared for intents it recorded, by intent id, oldest first."""
        self._executed = {
            status: metrics.executed.labels(ToolResult.Status.Name(status))
            for status in ToolResult.Status.values()
        }
        self._tool_latency: dict[str, Any] = {}
        self._loops: list[asyncio.Task[None]] = []
        self._next_count_at = 0.0
        """When (``time.monotonic``) the gauges may next count the intents in flight."""

    @property
    def owner(self) -> str:
        """The id this worker records on its leases."""
        return self._owner

    def start(self) -> None:
        """Start claiming and executing; call once, from the event loop."""
        self._loops = [
            asyncio.create_task(self._claim_loop(), name="effector-claims"),
            asyncio.create_task(self._housekeeping_loop(), name="effector-housekeeping"),
        ]

    def wake(self) -> None:
        """Look for runnable work now (new intents were submitted, or a key was released)."""
        self._wake.set()

    def keep_validated(self, intent_id: str, prepared: PreparedCall, args_bytes: int) -> None:
        """Keep the call Submit prepared for an intent the store recorded for the first time.

        Its execution takes it instead of validating the arguments again. What is not kept
        (see :class:`_ValidatedCalls`' bounds) is validated again when it runs.
        """
        if self._settings.concurrency == 0:
            return  # ingest-only: this replica never executes what it records
        self._validated.keep(intent_id, prepared, args_bytes)

    async def drain(self, grace_s: float) -> None:
        """Stop claiming, let executions finish for up to ``grace_s``, record, release the rest.

        Claims given back run again, as a new attempt, when an effector next starts.
        """
        self._stopping = True
        self._stopped.set()
        self.wake()
        claim_loop, housekeeping = self._loops
        await claim_loop
        if self._executions:
            _, unfinished = await asyncio.wait(set(self._executions), timeout=grace_s)
            for task in unfinished:
                task.cancel()
            await asyncio.gather(*unfinished, return_exceptions=True)
        housekeeping.cancel()
        await asyncio.gather(housekeeping, return_exceptions=True)
        try:
            await asyncio.wait_for(self._results_recorded(), grace_s)
        except TimeoutError:
            _log.warning("the store did not take the last results; those intents will run again")
            self._gave_up_recording = True
            commits = list(self._commits)
            for commit in commits:
                commit.cancel()
            await asyncio.gather(*commits, return_exceptions=True)
            await self._give_back_abandoned(grace_s)
        unstarted, self._unstarted = self._unstarted, []
        await self._release(unstarted, "unstarted claims", started=False)
        if self._claims:
            _log.warning("releasing %d claim(s) still running at shutdown", len(self._claims))
            await self._release(list(self._claims.values()), "claims")

    async def _release(self, claims: Sequence[Claim], what: str, *, started: bool = True) -> None:
        """Give ``claims`` back; if the store fails, log it and leave their leases to expire."""
        if claims:
            try:
                await self._store.release(claims, started=started)
            except StoreError as exc:
                _log.warning("releasing %s failed; the leases will expire: %s", what, exc)

    def _free_slots(self, freed: int = 0) -> int:
        """Slots neither executing nor reserved by a claim in progress (0 once draining).

        A claim whose result is in hand frees its slot, though it holds its key until the
        result is durable: one batch executes while the one before it is recorded. Claims held
        are at most twice the concurrency; ``freed`` of them are being recorded now.
        """
        if self._stopping:
            return 0
        concurrency = self._settings.concurrency
        held = len(self._claims) - freed
        return min(concurrency - self._executing, 2 * concurrency - held) - self._reserved

    async def _claim_loop(self) -> None:
        settings = self._settings
        if settings.concurrency == 0:
            return  # ingest-only: never claims, so every Submit's wake() would be wasted work
        while not self._stopping:
            self._wake.clear()
            free = self._free_slots()
            if free > 0:
                self._reserved += free
                try:
                    batch = await self._store.claim(
                        self._owner, free, self._clock(), settings.lease_ms
                    )
                except Exception as exc:
                    if not isinstance(exc, StoreError):  # a bug, not an outage: say where
                        _log.error("claiming work raised %r", exc, exc_info=exc)
                    delay_s = self._outage.failed("claiming work", exc)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopped.wait(), delay_s)
                    continue
                finally:
                    self._reserved -= free
                self._outage.succeeded("claiming work")
                self._start_batch(batch)
                if batch.claims or batch.expired:
                    continue
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), settings.poll_interval_ms / 1000)

    def _start_batch(self, batch: ClaimBatch) -> None:
        if batch.expired:
            self._metrics.expired.inc(batch.expired)
            audit.expired(batch.expired_intents)
        plain: list[Claim] = []
        for claim in batch.claims:
            if self._stopping:
                # Claimed by a commit that began before the drain: never started, given back.
                self._unstarted.append(claim)
                continue
            self._claims[claim.token] = claim
            intent = claim.intent
            if intent.kind == ToolIntent.TOOL and not (
                intent.compensates_intent_id or claim.possibly_started
            ):
                plain.append(claim)
            else:
                self._executing += 1
                task = asyncio.create_task(
                    self._execute(claim), name=f"effector-intent:{claim.token}"
                )
                self._executions.add(task)
                task.add_done_callback(self._executions.discard)
        if plain:
            self._execute_plain(plain)
        self._metrics.in_flight.set(len(self._claims))

    def _execute_plain(self, claims: Sequence[Claim]) -> None:
        """Execute first attempts of TOOL intents together (see ``execute_batch``)."""
        calls: list[ToolCall] = []
        called: list[Claim] = []
        for claim in claims:
            intent = claim.intent
            prepared = self._validated.take(intent.intent_id)
            if prepared is None:
                try:
                    prepared = prepare_call(self._registry, intent)
                except IntentRejectedError as exc:
                    audit.rejected(intent, str(exc))
                    result = rejected_result(intent, str(exc), now_ms=self._clock())
                    self._hand_over(Completion(claim, result))
                    continue
            calls.append(ToolCall(intent, prepared[0], prepared[1], claim.attempt))
            called.append(claim)
        if not calls:
            return
        self._executing += len(calls)

        def finished(index: int, result: ToolResult | None, seconds: float) -> None:
            self._executing -= 1
            claim = called[index]
            if result is None:
                if not self._stopping:  # the tool cancelled itself: give the claim back
                    self._claims.pop(claim.token, None)
                    release = asyncio.get_running_loop().create_task(self._give_back(claim))
                    self._executions.add(release)
                    release.add_done_callback(self._executions.discard)
                return  # cancelled by a drain, which gives the claim back
            tool_name = claim.intent.tool_name
            latency = self._tool_latency.get(tool_name)
            if latency is None:
                latency = self._tool_latency[tool_name] = self._metrics.tool_latency.labels(
                    tool_name
                )
            latency.observe(seconds)
            self._hand_over(Completion(claim, result))

        for task in self._runner.execute_batch(calls, self._clock, finished):
            self._executions.add(task)
            task.add_done_callback(self._executions.discard)

    async def _give_back(self, claim: Claim) -> None:
        """Release a claim whose call was cancelled, to be claimed (and asked about) again."""
        await self._release([claim], "the claim of a cancelled call")
        self.wake()

    async def _execute(self, claim: Claim) -> None:
        executing = True

        def done_executing() -> None:
            nonlocal executing
            if executing:
                executing = False
                self._executing -= 1

        try:
            if await self._run_claim(claim, done_executing):
                return  # recorded: the commit that took its result claimed its key's next work
            self._claims.pop(claim.token, None)
        except Exception:
            # Only a defect in the effector gets here (tool failures become ERROR results);
            # giving the claim back keeps the key from being blocked by a renewed lease.
            _log.exception(
                "executing intent %s failed; releasing its claim", claim.intent.intent_id
            )
            self._claims.pop(claim.token, None)
            await self._release([claim], "the claim")
        finally:
            done_executing()
            self._metrics.in_flight.set(len(self._claims))
        self.wake()

    async def _run_claim(self, claim: Claim, done_executing: Callable[[], None]) -> bool:
        """Settle, reconcile or execute ``claim``; ``True`` once its result was recorded.

        ``done_executing`` is called when its result is in hand, before it is recorded.
        """
        metrics = self._metrics
        if claim.intent.compensates_intent_id and await self._settled_compensation(claim):
            return False
        # Reconcile before re-executing (see ask_reconciler).
        settled = await ask_reconciler(self._runner, self._registry, claim, self._clock)
        if isinstance(settled, InDoubt):
            metrics.reconciliations.labels("failed").inc()
            await self._leave_in_doubt(claim, settled)
            return False
        if isinstance(settled, Found):
            metrics.reconciliations.labels("found").inc()
            done_executing()
            await self._recorded(Completion(claim, settled.result))
        elif isinstance(settled, NotFound) and settled.expired is not None:
            done_executing()
            if await self._recorded(Completion(claim, settled.expired)):
                metrics.expired.inc()
                audit.expired([claim.intent])
        else:
            if isinstance(settled, NotFound):
                metrics.reconciliations.labels("not_found").inc()
            started = time.perf_counter()
            result = await self._runner.execute(
                self._registry, claim.intent, attempt=claim.attempt, clock=self._clock
            )
            metrics.tool_latency.labels(claim.intent.tool_name).observe(
                time.perf_counter() - started
            )
            done_executing()
            if await self._recorded(Completion(claim, result)):
                self._executed[result.status].inc()
        return True

    async def _settled_compensation(self, claim: Claim) -> bool:
        """Settle a compensation in the store (through outages); ``False``: execute it."""
        settled = await self._through_outages(
            "settling a compensation",
            lambda: self._store.settle_compensation(claim, self._clock()),
        )
        if settled.refused_original is not None:
            reason = late_original_reason(claim.intent.intent_id)
            audit.rejected(settled.refused_original, reason)
        if settled.execute:
            return False
        result = settled.result
        if result is not None and settled.recorded:
            self._executed[result.status].inc()
            if result.status == ToolResult.REJECTED:
                audit.rejected(claim.intent, result.error_message)
            else:
                audit.not_needed(claim.intent, result.error_message)
        return True

    async def _leave_in_doubt(self, claim: Claim, in_doubt: InDoubt) -> None:
        """Record the claim's intent IN_DOUBT (its key held until the retry), through outages."""

        def mark() -> Awaitable[bool]:
            now = self._clock()
            return self._store.mark_in_doubt(
                claim, in_doubt.reason, now, now + in_doubt.retry_in_ms
            )

        await self._through_outages("recording an intent in doubt", mark)

    async def _through_outages(self, operation: str, call: Callable[[], Awaitable[_T]]) -> _T:
        """``call()``, retried with growing waits (:class:`StoreOutage`) until the store answers."""
        while True:
            try:
                answer = await call()
            except StoreError as exc:
                await asyncio.sleep(self._outage.failed(operation, exc))
                continue
            self._outage.succeeded(operation)
            return answer

    def _hand_over(
        self, completion: Completion, answer: asyncio.Future[bool] | None = None
    ) -> None:
        """Put a result in the outbox: the next commit records it (and ``answer`` hears)."""
        self._outbox.append((completion, answer))
        self._start_commit()

    def _start_commit(self) -> None:
        """Start a commit of the outbox, unless one is starting or enough are in flight."""
        if (
            self._commit_starting
            or self._gave_up_recording
            or len(self._commits) >= COMMITS_IN_FLIGHT
            or not self._outbox
        ):
            return
        self._commit_starting = True
        commit = asyncio.get_running_loop().create_task(
            self._commit_results(), name="effector-results"
        )
        self._commits.add(commit)
        commit.add_done_callback(self._commit_done)

    def _commit_done(self, commit: asyncio.Task[None]) -> None:
        self._commits.discard(commit)
        self._start_commit()

    async def _recorded(self, completion: Completion) -> bool:
        """Record one result with the next commit; ``False`` if another result won."""
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._hand_over(completion, answer)
        return await answer

    async def _commit_results(self) -> None:
        """Record what is in the outbox now (it takes all); count what was recorded.

        Results handed over meanwhile go to the next commit, which may start while this one
        is in flight: the store takes it as soon as this one is done.
        """
        self._commit_starting = False
        entries, self._outbox = self._outbox, []
        if not entries:
            return
        tokens = {completion.claim.token for completion, _ in entries}
        self._recording |= tokens
        try:
            recorded = await self._record([completion for completion, _ in entries])
        except BaseException:
            for _, answer in entries:  # cancelled (a drain gave up): nobody hears
                if answer is not None:
                    answer.cancel()
            raise
        finally:
            self._recording -= tokens
        executed: collections.Counter[ToolResult.Status] = collections.Counter()
        for (completion, answer), was_recorded in zip(entries, recorded, strict=True):
            if answer is None:
                if was_recorded:
                    executed[completion.result.status] += 1
            elif not answer.done():
                answer.set_result(was_recorded)
        for status, count in executed.items():
            self._executed[status].inc(count)
        self._metrics.in_flight.set(len(self._claims))

    async def _results_recorded(self) -> None:
        """Wait until the outbox is empty and its last commit is done."""
        while self._commits:
            await asyncio.wait(set(self._commits))

    async def _record(self, completions: Sequence[Completion]) -> list[bool]:
        """Record a group of results, then claim work for the slots they free, at once."""
        while True:
            free = self._free_slots(freed=len(completions))
            request = ClaimRequest(self._owner, max(free, 0), self._settings.lease_ms)
            self._reserved += request.limit
            # Shielded: a drain that gives up on this commit must not lose what it claimed.
            commit = asyncio.ensure_future(
                self._store.complete_and_claim(completions, self._clock(), request)
            )
            try:
                recorded, batch = await asyncio.shield(commit)
            except asyncio.CancelledError:
                self._abandoned_commits.append(commit)  # the drain releases what it claims
                raise
            except StoreError as exc:
                # Results stay in memory until the store is back: nothing executed is dropped.
                await asyncio.sleep(self._outage.failed("recording results", exc))
                continue
            finally:
                self._reserved -= request.limit
            self._outage.succeeded("recording results")
            for completion in completions:
                self._claims.pop(completion.claim.token, None)
            self._start_batch(batch)
            if batch.expired or len(batch.claims) < len(completions):
                # Slots left unfilled: refused heads, a claim that failed, or a limit cut by
                # the claim loop's reservation (its claim may have run before these keys were
                # free, so it looks again).
                self.wake()
            return recorded

    async def _give_back_abandoned(self, grace_s: float) -> None:
        """Release what the commits a timed-out drain abandoned claimed, once they are done."""
        commits, self._abandoned_commits = self._abandoned_commits, []
        for commit in commits:
            try:
                _, batch = await asyncio.wait_for(asyncio.shield(commit), grace_s)
            except Exception as exc:  # the store is out, or slower than the grace: leases expire
                _log.warning(
                    "an abandoned commit did not finish; its claims' leases will expire: %s", exc
                )
                continue
            await self._release(batch.claims, "abandoned claims", started=False)

    async def _housekeeping_loop(self) -> None:
        settings = self._settings
        renew_every_ms = settings.lease_ms // 3
        shortest_retention_ms = min(settings.result_retention_ms, self._telemetry_retention_ms)
        prune_every_ms = min(60_000, max(shortest_retention_ms // 4, 1))
        last_renewal = last_prune = self._clock()
        interval_s = wait_s = settings.housekeeping_interval_ms / 1000
        while True:
            await asyncio.sleep(wait_s)
            wait_s = interval_s
            now = self._clock()
            try:
                if now - last_renewal >= renew_every_ms:
                    last_renewal = now
                    await self._renew(now)
                expired = await self._store.expire_approvals(now, _APPROVAL_EXPIRY_BATCH)
                if expired:
                    self._metrics.expired.inc(len(expired))
                    audit.expired(expired)
                if now - last_prune >= prune_every_ms:
                    last_prune = now
                    await self._store.prune(now, settings.result_retention_ms)
                    await self._store.prune_telemetry(now, self._telemetry_retention_ms)
                await self._refresh_gauges()
            except StoreError as exc:
                wait_s = max(interval_s, self._outage.failed("housekeeping", exc))
            else:
                self._outage.succeeded("housekeeping")

    async def _refresh_gauges(self) -> None:
        """Set the queue-depth and in-doubt gauges, as often as their count's cost allows."""
        started = time.monotonic()
        if started < self._next_count_at:
            return
        counts = await self._store.counts(done=False)
        took_s = time.monotonic() - started
        self._next_count_at = started + min(took_s / GAUGE_COUNT_SHARE, GAUGE_COUNT_WAIT_MAX_S)
        self._metrics.queue_depth.set(
            counts.pending + counts.running + counts.in_doubt + counts.awaiting_decision
        )
        self._metrics.in_doubt.set(counts.in_doubt)

    async def _renew(self, now: int) -> None:
        claims = list(self._claims.values())
        if not claims:
            return
        held = await self._store.renew(claims, now, self._settings.lease_ms)
        for claim in claims:
            # Not held and not finished meanwhile (nor being recorded: a commit may have
            # released it just before): the lease ran out before this renewal, so the intent
            # may be executing elsewhere too; the first recorded result wins.
            token = claim.token
            if token not in held and token in self._claims and token not in self._recording:
                _log.warning("lease on intent %s ran out before renewal", claim.intent.intent_id)
