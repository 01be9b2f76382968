"""``EffectorToolRunner``: the one place a side-effecting tool is executed.

:meth:`~EffectorToolRunner.run` refuses a read-only tool, validates the arguments, injects
``intent=IntentInfo`` when the tool asks for it, and calls the tool under a per-call timeout
(sync tools on pooled daemon threads). :meth:`~EffectorToolRunner.execute` maps one attempt at
a ``ToolIntent`` to its ``ToolResult``: REJECTED when the tool never ran, ERROR when it failed,
OK otherwise (the rules are in ``effector/README.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import queue
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import effector.audit as audit
from beam_agents._protos import ToolIntent, ToolResult, canonical_json_bytes
from beam_agents.tools import IntentInfo, Reconciled, Tool, ToolRegistry
from beam_agents.tools.errors import ToolArgumentError, ToolNotFoundError
from effector.errors import ToolRefusedError, ToolTimeoutError
from effector.intents import new_result, parse_arguments, rejected_result, ttl_problem

MAX_ERROR_MESSAGE_CHARS = 4_096
"""Error messages in results are cut to this length, so one failure cannot bloat the log."""


class IntentRejectedError(Exception):
    """An intent cannot be executed as written; the message is the recorded reason."""


def prepare_call(
    registry: ToolRegistry, intent: ToolIntent
) -> tuple[Tool[..., Any], dict[str, Any]]:
    """Resolve a TOOL intent to its tool and validated keyword arguments.

    Raises :class:`IntentRejectedError` with the reason if the tool is unknown or read-only,
    ``args_json`` is not a JSON object, or the arguments fail the tool's argument model.
    """
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
            f"arguments for tool {tool.name!r} could not be validated: {type(exc).__name__}: {exc}"
        ) from None


def rejection_reason(registry: ToolRegistry, intent: ToolIntent) -> str | None:
    """Why a well-identified intent must be recorded as REJECTED, or ``None`` if it is valid."""
    if intent.kind == ToolIntent.APPROVAL:
        try:
            parse_arguments(intent.args_json)
        except ValueError as exc:
            return f"args_json of approval intent is not JSON: {exc}"
    elif intent.kind == ToolIntent.TOOL:
        try:
            prepare_call(registry, intent)
        except IntentRejectedError as exc:
            return str(exc)
    else:
        return f"unknown intent kind {int(intent.kind)}"
    return ttl_problem(intent)


def _read_only_refusal(tool: Tool[..., Any]) -> ToolRefusedError:
    return ToolRefusedError(
        f"tool {tool.name!r} is read-only (side_effect=False): it runs inline in the pipeline "
        f"through ToolRunner, never in the effector"
    )


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

        Raises ``ToolRefusedError`` for a read-only tool (never invoked) or when the tool
        declares ``intent`` but no ``intent_info`` is given, ``ToolArgumentError`` for invalid
        arguments (never invoked), ``ToolTimeoutError`` past the timeout, and whatever the tool
        itself raises.
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
        info = IntentInfo(
            intent_id=intent.intent_id,
            entity_key=intent.entity_key,
            seq=intent.seq,
            step_index=intent.step_index,
            attempt=attempt,
        )
        try:
            value = await self._call(tool, kwargs, info)
            payload = _encode(tool, value)
        # A tool that calls sys.exit() is a failed tool, not a request to stop the effector.
        except (Exception, SystemExit) as exc:
            failed = new_result(
                intent,
                ToolResult.ERROR,
                completed_at_ms=clock(),
                attempt=attempt,
                error_message=_describe(exc)[:MAX_ERROR_MESSAGE_CHARS],
            )
            audit.tool_failed(intent, failed, exc)
            return failed
        return new_result(
            intent, ToolResult.OK, completed_at_ms=clock(), attempt=attempt, payload=payload
        )

    async def _call(
        self, tool: Tool[..., Any], kwargs: dict[str, Any], intent_info: IntentInfo | None
    ) -> Any:
        if tool.accepts_intent:
            if intent_info is None:
                raise ToolRefusedError(
                    f"tool {tool.name!r} declares intent: IntentInfo; run it with intent_info"
                )
            kwargs = {**kwargs, "intent": intent_info}
        function = tool.unwrap()
        is_async = inspect.iscoroutinefunction(function)
        return await self._bounded(function, kwargs, is_async, f"tool {tool.name!r}")

    async def reconcile(
        self, tool: Tool[..., Any], kwargs: dict[str, Any], intent_info: IntentInfo
    ) -> Reconciled | None:
        """Ask ``tool``'s reconciler whether the intent's effect happened, under the timeout.

        ``kwargs`` are the validated arguments. Raises ``ValueError`` if the tool has no
        reconciler, ``ToolTimeoutError`` past the timeout, ``TypeError`` if the reconciler
        answers something other than ``Reconciled`` or ``None``, and whatever it raises.
        """
        reconciler = tool.reconcile_with
        if reconciler is None:
            raise ValueError(f"tool {tool.name!r} has no reconciler")
        call = functools.partial(reconciler, intent_info, dict(kwargs))
        is_async = inspect.iscoroutinefunction(reconciler)
        answer = await self._bounded(call, {}, is_async, f"the reconciler of tool {tool.name!r}")
        if answer is not None and not isinstance(answer, Reconciled):
            raise TypeError(
                f"the reconciler of tool {tool.name!r} returned {type(answer).__name__}, "
                f"not Reconciled or None"
            )
        return answer

    async def _bounded(
        self, function: Callable[..., Any], kwargs: dict[str, Any], is_async: bool, what: str
    ) -> Any:
        """``function(**kwargs)`` under the timeout: async on this loop, sync on a pool thread."""
        try:
            async with asyncio.timeout(self._timeout_ms / 1000) as scope:
                if is_async:
                    value = function(**kwargs)
                else:
                    value = await self._threads.call(function, kwargs)
                if inspect.isawaitable(value):
                    value = await value
        except TimeoutError:
            if scope.expired():
                raise ToolTimeoutError(
                    f"{what} did not finish within {self._timeout_ms} ms"
                ) from None
            raise
        return value


class _ResultNotJsonError(Exception):
    pass


def _encode(tool: Tool[..., Any], value: Any) -> bytes:
    try:
        return canonical_json_bytes(value)
    except (TypeError, ValueError) as exc:
        raise _ResultNotJsonError(
            f"tool {tool.name!r} returned a value that is not JSON-encodable: {exc}"
        ) from None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, (ToolTimeoutError, _ResultNotJsonError)):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


class _Inbox:
    """What pool threads finished for one event loop, handed over with one wake-up per batch.

    Waking a loop from another thread costs a write to its self-pipe and a turn of the loop;
    calls finishing while a hand-over is already scheduled join it instead of waking again.
    """

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
    """Daemon threads that run sync tools: an idle one is reused, otherwise another starts.

    Threads are daemons so that a tool abandoned after its timeout never holds up shutdown,
    and the pool grows past any fixed size rather than let abandoned tools starve new calls.
    A thread idle for ``_IDLE_EXIT_S`` exits. Results reach their loop through its
    :class:`_Inbox`.
    """

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
                error = RuntimeError(f"the tool raised StopIteration: {exc}")
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
