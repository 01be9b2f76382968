"""How a ``FakeLLM`` rule answers: the ``Behavior`` classes and the simulated latency.

Each behavior answers a matched request with a raw body (decoded in the fake's shape), a
finished ``LlmResponse``, or an error. Build them with the ``respond_with*``, ``raise_error``
and ``fail_then_succeed`` functions of :mod:`beam_agents.model.fake`.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeAlias

from beam_agents.model.client import LlmRequest, LlmResponse, TokenUsage, ToolCall
from beam_agents.model.fake_wire import Shape, scripted_answer

Responder: TypeAlias = Callable[[LlmRequest], "bytes | LlmResponse"]
"""What :func:`respond_with_fn` calls: a raw body (decoded in the fake's shape) or a response."""


class ScriptedClient(Protocol):
    """What a behavior may use of the fake it answers for (a ``FakeLLM``)."""

    shape: Shape

    def decode(self, raw: bytes) -> LlmResponse:
        """Rebuild the response for a raw body in the fake's shape."""
        ...


class Behavior(ABC):
    """How a rule answers a request it matched."""

    @abstractmethod
    async def respond(
        self, fake: ScriptedClient, request: LlmRequest, earlier_matches: int
    ) -> bytes | LlmResponse:
        """A raw body (decoded in the fake's shape) or a finished response for ``request``.

        ``earlier_matches`` counts this rule's earlier uses.
        """


_TIMER_LATENESS_S = 0.0015
"""How late an asyncio timer may fire beyond the kernel's slack: epoll counts whole ms."""
_TIMER_SLACK = 0.002
"""The kernel lets a wait of T overrun by T / 1000; twice that, to be safe."""


async def simulate_latency(latency_ms: int) -> None:
    """Yield to the event loop for ``latency_ms``, ending on time to within microseconds.

    A plain ``asyncio.sleep`` wakes up to ~1 ms late plus 0.1% of the wait (see the constants),
    which a benchmark would count as the caller's overhead; a real provider's answer wakes the
    loop through its socket, with no timer. So the bulk of the wait is a timer that ends just
    early, and the last millisecond or two yields to the loop until the deadline.
    """
    if not latency_ms:
        return
    latency_s = latency_ms / 1000
    deadline = time.perf_counter() + latency_s
    coarse_s = latency_s - _TIMER_LATENESS_S - latency_s * _TIMER_SLACK
    if coarse_s > 0:
        await asyncio.sleep(coarse_s)
    while time.perf_counter() < deadline:
        await asyncio.sleep(0)


@dataclass(frozen=True, slots=True)
class RespondWith(Behavior):
    """Answers with a fixed raw body (its usage replaced when ``usage`` is set)."""

    payload: bytes
    latency_ms: int
    usage: TokenUsage | None

    async def respond(
        self, fake: ScriptedClient, request: LlmRequest, earlier_matches: int
    ) -> bytes | LlmResponse:
        """``payload`` after the latency, or its decoding with ``usage`` when that is set."""
        await simulate_latency(self.latency_ms)
        if self.usage is None:
            return self.payload
        return dataclasses.replace(fake.decode(self.payload), usage=self.usage)


@dataclass(frozen=True, slots=True)
class Scripted(Behavior):
    """Answers with scripted text and tool calls, as a body in the fake's shape."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    usage: TokenUsage | None
    latency_ms: int

    async def respond(
        self, fake: ScriptedClient, request: LlmRequest, earlier_matches: int
    ) -> bytes | LlmResponse:
        """The scripted answer's body in the fake's shape, after the latency."""
        await simulate_latency(self.latency_ms)
        return scripted_answer(fake.shape, request, (self.text, self.tool_calls, self.usage))


@dataclass(frozen=True, slots=True)
class RespondWithFn(Behavior):
    """Answers with whatever a responder function returns for the request."""

    responder: Responder
    latency_ms: int

    async def respond(
        self, fake: ScriptedClient, request: LlmRequest, earlier_matches: int
    ) -> bytes | LlmResponse:
        """What the responder returns for ``request``, after the latency."""
        await simulate_latency(self.latency_ms)
        answer = self.responder(request)
        if not isinstance(answer, bytes | LlmResponse):
            raise TypeError(
                f"the respond_with_fn function {self.responder!r} must return bytes or an "
                f"LlmResponse, got {type(answer).__name__}"
            )
        return answer


@dataclass(frozen=True, slots=True)
class RaiseError(Behavior):
    """Raises (a copy of) an error on every matching request."""

    error: Exception

    async def respond(
        self, fake: ScriptedClient, request: LlmRequest, earlier_matches: int
    ) -> bytes | LlmResponse:
        """Raise a fresh copy of the error."""
        # A fresh copy each time, so repeated raises do not pile tracebacks onto one instance.
        raise copy.copy(self.error).with_traceback(None)


@dataclass(frozen=True, slots=True)
class FailThenSucceed(Behavior):
    """Raises an error for the first ``times`` matches, then answers ``payload``."""

    error: Exception
    times: int
    payload: bytes

    async def respond(
        self, fake: ScriptedClient, request: LlmRequest, earlier_matches: int
    ) -> bytes | LlmResponse:
        """Raise while ``earlier_matches < times``, then answer ``payload``."""
        if earlier_matches < self.times:
            raise copy.copy(self.error).with_traceback(None)
        return self.payload
