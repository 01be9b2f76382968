"""MCP servers and this process's sessions to them: ``McpServer``, the errors, ``SessionPool``.

An MCP session must be entered and left by one task, so every session lives on one daemon
thread's loop; callers on any loop reach it through futures.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import anyio
import httpx2
import mcp.types as mcp_types
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from beam_agents.tools.errors import ToolError

_log = logging.getLogger(__name__)

DEFAULT_CALL_TIMEOUT_S = 30.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class McpServer:
    """An MCP server description (:meth:`stdio`, :meth:`http`); its repr shows no credentials."""

    transport: Literal["stdio", "http"]
    command: str = ""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    url: str = ""
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        *,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    ) -> McpServer:
        """A server run as ``command args``; ``env`` joins the SDK's minimal one, not ours."""
        if not isinstance(command, str) or not command:
            raise ValueError(f"McpServer.stdio needs a command, got {command!r}")
        if isinstance(args, str):
            raise TypeError("McpServer.stdio args is a sequence of strings, not one string")
        return cls(
            "stdio",
            command=command,
            args=tuple(str(arg) for arg in args),
            env=_pairs(env, "env"),
            call_timeout_s=_positive(call_timeout_s, "call_timeout_s"),
            connect_timeout_s=_positive(connect_timeout_s, "connect_timeout_s"),
        )

    @classmethod
    def http(
        cls,
        url: str,
        headers: Mapping[str, str] | None = None,
        *,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    ) -> McpServer:
        """A server at ``url`` over streamable HTTP, sent ``headers`` (say, authorization)."""
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"McpServer.http needs an http:// or https:// URL, got {url!r}")
        return cls(
            "http",
            url=url,
            headers=_pairs(headers, "headers"),
            call_timeout_s=_positive(call_timeout_s, "call_timeout_s"),
            connect_timeout_s=_positive(connect_timeout_s, "connect_timeout_s"),
        )

    @property
    def label(self) -> str:
        """How messages name the server: its URL, or its command line."""
        if self.transport == "http":
            return self.url
        return " ".join((self.command, *self.args))


def _pairs(mapping: Mapping[str, str] | None, what: str) -> tuple[tuple[str, str], ...]:
    if mapping is None:
        return ()
    if not isinstance(mapping, Mapping):
        raise TypeError(f"McpServer {what} must be a mapping of str to str")
    for key, value in mapping.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"McpServer {what} must map str to str, got {key!r}: {value!r}")
    return tuple(sorted(mapping.items()))


def _positive(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"McpServer {what} must be a positive number of seconds, got {value!r}")
    return float(value)


class McpError(ToolError):
    """Base class of the errors an MCP tool call or listing raises."""


class McpConnectionError(McpError, ConnectionError):
    """The server could not be reached, or broke off; ``sent``: the request may have run."""

    def __init__(self, message: str, *, tool_name: str | None = None, sent: bool = False) -> None:
        super().__init__(message, tool_name=tool_name)
        self.sent = sent


class McpTimeoutError(McpError, TimeoutError):
    """The server did not answer within the call's time limit (the session stays usable)."""


class McpToolError(McpError):
    """The server ran the tool and reported failure; ``content`` is the text it returned."""

    def __init__(self, message: str, *, tool_name: str | None = None, content: str = "") -> None:
        super().__init__(message, tool_name=tool_name)
        self.content = content


class McpResultError(McpError):
    """The server's answer is not a valid MCP result (malformed, or off its output schema)."""


_T = TypeVar("_T")

_BACKOFF_FIRST_S = 0.1
_BACKOFF_MAX_S = 5.0
_CLOSE_WAIT_S = 5.0
_LIST_PAGES_MAX = 100
_CONNECTION_ERRORS = (
    OSError,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    anyio.EndOfStream,
    httpx2.TransportError,
)


class _Session:
    """One server's connection state; touched only on the pool's loop (``refs`` under a lock)."""

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self.client: Client | None = None
        self.stop: asyncio.Event | None = None
        self.keeper: asyncio.Task[None] | None = None
        self.lock = asyncio.Lock()
        self.failures = 0
        self.retry_at = 0.0
        self.last_error = ""
        self.refs = 0
        self.tasks: set[asyncio.Task[None]] = set()


class SessionPool:
    """Every MCP session of this process; see the module docstring. Use :func:`session_pool`."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="beam-agents-mcp", daemon=True
        )
        self._thread.start()
        self._sessions: dict[McpServer, _Session] = {}
        self._guard = threading.Lock()
        self._closed = False
        # Per server, a version and the tools it lists, re-listed on ``list_changed``.
        self.catalog: dict[McpServer, tuple[int, dict[str, mcp_types.Tool]]] = {}

    def acquire(self, server: McpServer) -> None:
        """Hold ``server``'s session open until as many releases; start connecting now."""
        session = self._session(server)
        with self._guard:
            session.refs += 1
        if not self._closed:
            asyncio.run_coroutine_threadsafe(self._connect_quietly(session), self._loop)

    def release(self, server: McpServer) -> None:
        """Drop one hold on ``server``'s session; the last one closes it (waits a little)."""
        with self._guard:
            session = self._sessions.get(server)
            if session is None or session.refs <= 0:
                return
            session.refs -= 1
            if session.refs:
                return
        with contextlib.suppress(Exception):
            self.run(self._close(session, only_unheld=True), _CLOSE_WAIT_S + 1)

    def run(self, coroutine: Awaitable[_T], timeout_s: float) -> _T:
        """Run ``coroutine`` on the pool's loop and wait for it (not from the pool's thread)."""
        if self._closed:
            raise McpConnectionError("the MCP sessions of this process are closed (at exit)")
        future = asyncio.run_coroutine_threadsafe(_awaited(coroutine), self._loop)
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    async def call_tool(
        self,
        server: McpServer,
        name: str,
        arguments: dict[str, Any],
        *,
        meta: dict[str, Any] | None,
        timeout_s: float,
    ) -> mcp_types.CallToolResult:
        """Call ``name`` on ``server`` from any event loop; typed errors (above)."""
        if self._closed:
            raise McpConnectionError("the MCP sessions of this process are closed (at exit)")
        coroutine = self._call(self._session(server), name, arguments, meta, timeout_s)
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return await asyncio.wrap_future(future)

    def list_tools(self, server: McpServer) -> dict[str, mcp_types.Tool]:
        """The tools ``server`` offers, fetched once per process; typed errors."""
        known = self.catalog.get(server)
        if known is not None:
            return known[1]
        limit = server.connect_timeout_s + server.call_timeout_s
        try:
            return self.run(self._refresh(self._session(server)), limit + 1)
        except TimeoutError:
            raise McpTimeoutError(
                f"MCP server {server.label} did not list its tools within {limit:g} s"
            ) from None

    def forget(self, server: McpServer) -> None:
        """Close ``server``'s session whoever holds it, and drop its listing."""
        with self._guard:
            session = self._sessions.pop(server, None)
        self.catalog.pop(server, None)
        if session is not None:
            with contextlib.suppress(Exception):
                self.run(self._close(session), _CLOSE_WAIT_S + 1)

    def close(self) -> None:
        """Close every session and stop the loop (at interpreter exit)."""
        with self._guard:
            sessions = list(self._sessions.values())
        for session in sessions:
            with contextlib.suppress(Exception):
                self.run(self._close(session), _CLOSE_WAIT_S)
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)

    def _session(self, server: McpServer) -> _Session:
        with self._guard:
            session = self._sessions.get(server)
            if session is None:
                session = self._sessions[server] = _Session(server)
            return session

    async def _call(
        self,
        session: _Session,
        name: str,
        arguments: dict[str, Any],
        meta: dict[str, Any] | None,
        timeout_s: float,
    ) -> mcp_types.CallToolResult:
        label = session.server.label
        try:
            async with asyncio.timeout(timeout_s) as scope:
                client = await self._connected(session, self._loop.time() + timeout_s, name)
                try:
                    return await client.call_tool(name, arguments, meta=meta)  # type: ignore[arg-type]
                except _CONNECTION_ERRORS as exc:
                    self._drop(session, client, _reason(exc))
                    raise McpConnectionError(
                        f"the connection to MCP server {label} failed during {name!r}: "
                        f"{_reason(exc)}",
                        tool_name=name,
                        sent=True,
                    ) from None
        except McpError:
            raise
        except TimeoutError:
            if not scope.expired():
                raise
            raise McpTimeoutError(
                f"MCP tool {name!r} on {label} did not answer within {timeout_s:g} s",
                tool_name=name,
            ) from None
        except MCPError as exc:
            if exc.code == mcp_types.CONNECTION_CLOSED:
                self._drop(session, client, "the server closed it")
                raise McpConnectionError(
                    f"the connection to MCP server {label} closed during {name!r}",
                    tool_name=name,
                    sent=True,
                ) from None
            raise McpToolError(
                f"MCP server {label} refused tool {name!r}: {exc.message} (code {exc.code})",
                tool_name=name,
                content=exc.message,
            ) from None
        except ValidationError as exc:
            raise McpResultError(
                f"MCP server {label} answered {name!r} with a malformed result: {_problems(exc)}",
                tool_name=name,
            ) from None
        except RuntimeError as exc:  # the SDK's check of structured content against outputSchema
            raise McpResultError(
                f"MCP server {label} answered {name!r} off its output schema: {exc}",
                tool_name=name,
            ) from None

    async def _connected(self, session: _Session, deadline: float, name: str = "") -> Client:
        """The open session, connecting (again, after the backoff) until ``deadline``."""
        while True:
            if session.client is not None:
                return session.client
            async with session.lock:
                if session.client is not None:
                    return session.client
                wait = session.retry_at - self._loop.time()
                if wait > 0 and self._loop.time() + wait >= deadline:
                    raise _gave_up(session, name)
                if wait > 0:
                    await asyncio.sleep(wait)
                limit = min(session.server.connect_timeout_s, deadline - self._loop.time())
                try:
                    return await self._open(session, limit)
                except McpConnectionError:
                    if self._loop.time() >= deadline:
                        raise _gave_up(session, name) from None

    async def _open(self, session: _Session, timeout_s: float) -> Client:
        ready: asyncio.Future[Client] = self._loop.create_future()
        stop = asyncio.Event()
        keeper = session.keeper = asyncio.create_task(self._keep(session, ready, stop))
        try:
            async with asyncio.timeout(max(timeout_s, 0.001)):
                client = await asyncio.shield(ready)
        except asyncio.CancelledError:
            keeper.cancel()  # the caller gave up (or the session is closing): not a failure
            session.keeper = None
            raise
        except BaseException as exc:
            keeper.cancel()
            session.keeper = None
            if ready.done() and not ready.cancelled():
                ready.exception()  # retrieved: asyncio would log it otherwise
            session.failures += 1
            backoff = min(_BACKOFF_MAX_S, _BACKOFF_FIRST_S * 2 ** (session.failures - 1))
            session.retry_at = self._loop.time() + backoff
            session.last_error = (
                f"no answer within {timeout_s:g} s"
                if isinstance(exc, TimeoutError)
                else _reason(exc)
            )
            raise McpConnectionError(
                f"cannot connect to MCP server {session.server.label}: {session.last_error}"
            ) from None
        session.failures, session.last_error = 0, ""
        session.stop = stop
        return client

    async def _connect_quietly(self, session: _Session) -> None:
        try:
            await self._connected(session, self._loop.time() + session.server.connect_timeout_s)
        except Exception as exc:  # the first call connects again, after the backoff
            _log.warning("MCP server %s is not reachable yet: %s", session.server.label, exc)

    async def _keep(
        self, session: _Session, ready: asyncio.Future[Client], stop: asyncio.Event
    ) -> None:
        """Hold one session open until ``stop`` (or until it breaks), in this one task."""

        async def on_message(message: Any) -> None:  # tools/list_changed, before 2026-07-28
            if isinstance(message, mcp_types.ToolListChangedNotification):
                self._spawn(session, self._refresh_quietly(session))

        client: Client | None = None
        try:
            async with _opened(session.server, on_message) as client:
                session.client = client
                if not ready.done():
                    ready.set_result(client)
                listening = asyncio.create_task(self._listen(session, client))
                try:
                    await stop.wait()
                finally:
                    listening.cancel()
        except BaseException as exc:
            if not ready.done():
                if isinstance(exc, asyncio.CancelledError):
                    ready.cancel()
                else:
                    ready.set_exception(exc)
            elif not stop.is_set() and not isinstance(exc, asyncio.CancelledError):
                _log.warning("MCP session to %s ended: %s", session.server.label, _reason(exc))
        finally:
            if session.client is client:
                session.client = None

    async def _listen(self, session: _Session, client: Client) -> None:
        """Re-list on every tools change event (2026-07-28 servers; older ones notify)."""
        try:
            async with client.listen(tools_list_changed=True) as changes:
                async for _ in changes:
                    await self._refresh_quietly(session)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a server without change events: the listing stays as fetched
            _log.debug("MCP server %s sends no tool change events: %s", session.server.label, exc)

    async def _refresh(self, session: _Session) -> dict[str, mcp_types.Tool]:
        label = session.server.label
        client = await self._connected(
            session, self._loop.time() + session.server.connect_timeout_s
        )
        tools: dict[str, mcp_types.Tool] = {}
        cursor: str | None = None
        try:
            for _ in range(_LIST_PAGES_MAX):
                page = await client.list_tools(cursor=cursor, cache_mode="refresh")
                tools.update((tool.name, tool) for tool in page.tools)
                cursor = page.next_cursor
                if cursor is None:
                    break
        except MCPError as exc:
            raise McpError(f"MCP server {label} refused to list its tools: {exc.message}") from None
        except ValidationError as exc:
            raise McpResultError(
                f"MCP server {label} listed its tools malformed: {_problems(exc)}"
            ) from None
        except _CONNECTION_ERRORS as exc:
            self._drop(session, client, _reason(exc))
            raise McpConnectionError(
                f"listing the tools of MCP server {label} failed: {_reason(exc)}"
            ) from None
        version = self.catalog.get(session.server, (0, {}))[0] + 1
        self.catalog[session.server] = (version, tools)
        return tools

    async def _refresh_quietly(self, session: _Session) -> None:
        try:
            await self._refresh(session)
        except Exception as exc:
            _log.warning(
                "re-listing the tools of MCP server %s failed: %s", session.server.label, exc
            )

    def _spawn(self, session: _Session, coroutine: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        session.tasks.add(task)
        task.add_done_callback(session.tasks.discard)

    def _drop(self, session: _Session, client: Client | None, reason: str) -> None:
        """Give up on ``client`` after a failure, unless a newer session already replaced it."""
        if client is None or session.client is not client:
            return
        if session.stop is not None:
            session.stop.set()
        session.client = None
        session.failures += 1
        session.last_error = f"the session broke off ({reason})"
        session.retry_at = self._loop.time() + _BACKOFF_FIRST_S

    async def _close(self, session: _Session, *, only_unheld: bool = False) -> None:
        if only_unheld and session.refs > 0:
            return  # held again since the last release
        keeper, stop = session.keeper, session.stop
        if stop is not None:
            stop.set()
        if keeper is not None:
            if session.client is None:
                keeper.cancel()  # still connecting: give up on it
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(keeper, _CLOSE_WAIT_S)
        session.client = session.keeper = session.stop = None


@contextlib.asynccontextmanager
async def _opened(server: McpServer, on_message: Any) -> AsyncIterator[Client]:
    """An entered ``Client`` for ``server`` (with its HTTP client, when there is one)."""
    async with contextlib.AsyncExitStack() as stack:
        if server.transport == "stdio":
            target: Any = StdioServerParameters(
                command=server.command, args=list(server.args), env=dict(server.env) or None
            )
        else:
            http = await stack.enter_async_context(
                create_mcp_http_client(headers=dict(server.headers) or None)
            )
            target = streamable_http_client(server.url, http_client=http)
        client = Client(target, message_handler=on_message, cache=None)
        yield await stack.enter_async_context(client)


def _gave_up(session: _Session, name: str) -> McpConnectionError:
    """The error of a call whose deadline ends before the session's next connection attempt."""
    failures = session.failures
    return McpConnectionError(
        f"cannot connect to MCP server {session.server.label}: gave up after {failures} "
        f"failed attempt{'' if failures == 1 else 's'} in a row; "
        f"last error: {session.last_error or 'none recorded'}",
        tool_name=name or None,
    )


async def _awaited(awaitable: Awaitable[_T]) -> _T:
    return await awaitable


def _reason(exc: BaseException) -> str:
    """The innermost failure, out of the task groups anyio wraps it in."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(part) for part in detail['loc']) or 'result'}: {detail['msg']}"
        for detail in exc.errors()[:5]
    )


_pool: SessionPool | None = None
_pool_pid = 0
_pool_guard = threading.Lock()


def session_pool() -> SessionPool:
    """The pool of this process, started on first use (and again in a forked child)."""
    global _pool, _pool_pid
    with _pool_guard:
        if _pool is None or _pool_pid != os.getpid():
            _pool, _pool_pid = SessionPool(), os.getpid()
        return _pool


def current_pool() -> SessionPool | None:
    """The pool of this process if one was started, without starting one."""
    return _pool if _pool_pid == os.getpid() else None


@atexit.register
def _close_at_exit() -> None:
    """Close this process's sessions (a forked child's inherited pool is not its own)."""
    global _pool
    with _pool_guard:
        pool, _pool = current_pool(), None
    if pool is not None:
        pool.close()
