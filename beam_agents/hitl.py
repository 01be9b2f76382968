"""Human in the loop: what a suspended run does when nobody answers in time.

A :class:`HitlPolicy` gives a suspension its deadline and an ``on_timeout`` route that, given
a :class:`FallbackContext`, returns :class:`Deny`, :class:`Drop` or :class:`Escalate`. The
route must be pure, synchronous and module-level: a retried timer bundle calls it again.
See "Human in the loop" in ``beam_agents/README.md``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias


@dataclass(frozen=True, slots=True)
class FallbackContext:
    """What a HITL timeout route (``HitlPolicy.on_timeout``) is given to decide on.

    Every field is a pure function of the key's state and the timer, so a retried timer bundle
    hands the route the same context and reaches the same decision. ``deadline_ms`` and
    ``fired_at_ms`` are processing time (epoch milliseconds on the runner's clock);
    ``fired_at_ms`` is the timestamp of the timer that fired.
    """

    entity_key: bytes
    seq: int
    snapshot: bytes
    deadline_ms: int
    fired_at_ms: int
    pending_intent_ids: frozenset[str]


@dataclass(frozen=True, slots=True)
class Deny:
    """End the suspended run; emit ``output`` on ``.output`` when it is not empty.

    ``compensate=True`` also undoes the run's effects: for each intent it staged with
    ``ctx.act(..., compensate_with=...)`` and did not compensate yet, unless its result says it
    never ran, the linked compensation is staged (newest first) on ``.intents``; the effector
    runs each after its original, or records NOT_NEEDED if that never ran.
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


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"HitlPolicy.{name} must be a positive int of milliseconds, got {value!r}")


@dataclass(frozen=True)
class HitlPolicy:
    """How a pipeline waits for people: deadlines, approval routing and the timeout route.

    ``timeout_ms``: processing time a suspended run waits before ``on_timeout`` decides (a
    ``Suspend.timeout_ms`` overrides it per suspension). ``intent_ttl_ms``: the default TTL of
    approval intents. ``approval_channel``: where approval requests are routed unless
    ``ctx.request_approval(channel=...)`` says otherwise. ``max_escalations``: how many times
    ``Escalate`` may re-ask before the run is denied with ``exhausted_output``.
    ``required_approvals``: how many distinct approvers must approve an approval request
    (a quorum; any deny denies at once); the effector gathers the votes.
    """

    timeout_ms: int
    intent_ttl_ms: int
    approval_channel: str
    on_timeout: TimeoutRoute
    max_escalations: int = 0
    exhausted_output: bytes = b""
    required_approvals: int = 1

    def __post_init__(self) -> None:
        _positive_int("timeout_ms", self.timeout_ms)
        _positive_int("intent_ttl_ms", self.intent_ttl_ms)
        if not isinstance(self.approval_channel, str):
            raise ValueError(
                f"HitlPolicy.approval_channel must be a str, "
                f"got {type(self.approval_channel).__name__}"
            )
        if (
            isinstance(self.max_escalations, bool)
            or not isinstance(self.max_escalations, int)
            or self.max_escalations < 0
        ):
            raise ValueError(
                f"HitlPolicy.max_escalations must be an int >= 0, got {self.max_escalations!r}"
            )
        if not isinstance(self.exhausted_output, bytes):
            raise ValueError(
                f"HitlPolicy.exhausted_output must be bytes, "
                f"got {type(self.exhausted_output).__name__}"
            )
        check_required_approvals(self.required_approvals, "HitlPolicy.required_approvals")
        _check_route_function(self.on_timeout)

    def decide(self, fallback: FallbackContext, escalations_so_far: int) -> Route:
        """The route for a timed-out suspension; ``Escalate`` past the limit becomes a ``Deny``.

        Raises ``TypeError`` if ``on_timeout`` returns something that is not a route.
        """
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
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not 1 <= value <= MAX_REQUIRED_APPROVALS
    ):
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
