"""A worker's leases on a fleet budget (``AgentConfig.budget``): admit, spend, lease in chunks.

Each worker process holds one :class:`LeasedBudget` per budget, shared by its ``RunAgent`` DoFn
instances (a runner may make one per bundle). A call is admitted while the worker's allowance
for the key's ledger lasts; the allowance is leased from the effector in
chunks, so most calls never wait on the network. The usage itself is debited by the
activation's ``BUDGET_DEBIT`` intents, which ``SubmitIntents`` delivers once it commits
(``docs/fleet.md``, "Fleet budgets").
"""

from __future__ import annotations

import atexit
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from beam_agents._protos import LeaseBudgetRequest, LeaseBudgetResponse
from beam_agents.core.agent import AgentRuntimeError, BudgetExceeded
from beam_agents.core.config import Budget
from beam_agents.core.staging import Allowance, Charge, allowance_for
from beam_agents.io.effector_link import EffectorConnection
from beam_agents.model.client import LlmResponse

_log = logging.getLogger(__name__)

_RPC_TIMEOUT_S = 10.0
UNREACHABLE_PATIENCE_S = 30.0
"""How long an admission keeps asking an unreachable effector before the activation fails."""
UNREACHABLE_MEMORY_S = 10.0
"""How long calls fail at once after the effector stayed unreachable for a whole patience."""
REFUSAL_MEMORY_S = 1.0
"""How long an exhausted window's refusal is remembered before the effector is asked again."""
MAX_REMEMBERED_CALLS = 8_192
"""Calls a worker remembers it admitted, per generation; the one before is kept too (the
answer memo these calls mirror keeps 1,024 per RunAgent)."""
_FIRST_PAUSE_S = 0.05
_RENEW_AT = 0.8
"""The fraction of a lease's time after which it is renewed (replaced) before the next call."""
_RETRYABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED}
)


class BudgetUnavailableError(AgentRuntimeError):
    """The effector keeping a fleet budget's ledger could not be reached; the activation fails."""


def as_connection(effector: object) -> EffectorConnection:
    """``Budget.effector`` as a connection: ``"HOST:PORT"`` or an ``EffectorConnection``."""
    if isinstance(effector, EffectorConnection):
        return effector
    if isinstance(effector, str):
        return EffectorConnection(effector)
    raise TypeError(
        f"Budget.effector must be 'HOST:PORT' or a beam_agents.io.EffectorConnection, got "
        f"{type(effector).__name__}"
    )


@dataclass(slots=True)
class _Lease:
    """One ledger's allowance this worker holds, and what it spent of it."""

    allowance: Allowance
    granted: tuple[int, int, int]
    """Tokens, cost (micro-dollars) and requests granted."""
    renew_at: float
    """Monotonic seconds after which the lease is replaced before a call."""
    spent: list[int] = field(default_factory=lambda: [0, 0, 0])

    def lasts(self, caps: tuple[int, int, int], window_start_ms: int, now: float) -> bool:
        """Whether it still admits a call: same window, not due for renewal, some of each left."""
        if self.allowance.window_start_ms != window_start_ms or now >= self.renew_at:
            return False
        spent, granted = self.spent, self.granted
        return (
            (not caps[0] or spent[0] < granted[0])
            and (not caps[1] or spent[1] < granted[1])
            and (not caps[2] or spent[2] < granted[2])
        )


_SHARED: dict[tuple[object, ...], LeasedBudget] = {}
_SHARED_LOCK = threading.Lock()


def shared_budget(budget: Budget) -> LeasedBudget:
    """The :class:`LeasedBudget` of ``budget`` in this process (one per budget and effector)."""
    connection = as_connection(budget.effector)
    identity = (
        budget.name,
        connection.target,
        budget.window,
        budget.tokens,
        budget.cost_usd,
        tuple(sorted(budget.prices.items())),
        budget.tenant_separator,
        budget.requests,
        budget.lease_tokens,
        budget.lease_cost_micros,
        budget.lease_requests,
    )
    with _SHARED_LOCK:
        leases = _SHARED.get(identity)
        if leases is None:
            leases = _SHARED[identity] = LeasedBudget(budget)
        return leases


@atexit.register
def _return_shared() -> None:
    """At exit, give back what this process's leases did not spend (else they lapse)."""
    with _SHARED_LOCK:
        held = list(_SHARED.values())
        _SHARED.clear()
    for leases in held:
        leases.close()


@dataclass(slots=True)
class _Flight:
    """One thread's LeaseBudget call for a ledger, which the others wait for and share."""

    done: threading.Event = field(default_factory=threading.Event)
    failure: BudgetUnavailableError | None = None


class BudgetSet:
    """The :class:`~beam_agents.core.staging.FleetBudget` of an agent: its budgets, in order."""

    def __init__(self, budgets: tuple[Budget, ...]) -> None:
        self._budgets = tuple(shared_budget(budget) for budget in budgets)
        self._only = self._budgets[0] if len(self._budgets) == 1 else None

    def admit(self, entity_key: bytes, call_id: str, model: str) -> tuple[Allowance, ...]:
        """Admit the call on every budget; the first that has nothing left refuses it."""
        if self._only is not None:
            return (self._only.admit(entity_key, call_id, model),)
        return tuple(budget.admit(entity_key, call_id, model) for budget in self._budgets)

    def spend(
        self, allowances: tuple[Allowance, ...], model: str, response: LlmResponse, call_id: str
    ) -> tuple[Charge, ...]:
        """Spend the call's usage on every budget it was admitted by."""
        if self._only is not None:
            return (self._only.spend(allowances[0], model, response, call_id),)
        return tuple(
            budget.spend(allowance, model, response, call_id)
            for budget, allowance in zip(self._budgets, allowances, strict=True)
        )


class LeasedBudget:
    """One budget's allowances on this worker, leased over gRPC."""

    def __init__(
        self,
        budget: Budget,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._budget = budget
        self._caps = (budget.tokens or 0, budget.cap_cost_micros, budget.requests or 0)
        self._connection = as_connection(budget.effector)
        self._clock, self._monotonic = clock, monotonic
        self._owner = f"{socket.gethostname()}/{os.getpid()}/{id(self):x}"
        self._leases: dict[str, _Lease] = {}
        self._calls: dict[str, tuple[Allowance, bool]] = {}
        """The allowance of each call admitted lately, and whether its usage was spent."""
        self._older_calls: dict[str, tuple[Allowance, bool]] = {}
        """The generation of calls before :attr:`_calls` filled up."""
        self._refused: dict[str, tuple[int, float, str]] = {}
        self._leasing: dict[str, _Flight] = {}
        """Ledgers a thread is leasing for right now; the others wait for its answer."""
        self._unreachable: dict[str, tuple[float, BudgetUnavailableError]] = {}
        """Ledgers whose effector stayed unreachable lately: until when calls fail at once."""
        self._window_ms = budget.window_ms
        self._priced = budget.cost_usd is not None
        self._one_ledger = budget.name if budget.tenant_separator is None else None
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None

    def admit(self, entity_key: bytes, call_id: str, model: str) -> Allowance:
        """The allowance call ``call_id`` of ``entity_key`` spends; leases a chunk when it ran out.

        A call this worker admitted before (its bundle is retried; the provider's answer comes
        from the worker's memo) gets the same allowance again, without a check. A cost budget
        refuses a ``model`` it has no price for here, before the provider is called.
        """
        if self._priced:
            self._budget.cost_micros(model, 0, 0)  # raises for a model without a price
        return self._admit(entity_key, call_id)

    def _admit(self, entity_key: bytes, call_id: str) -> Allowance:
        """Take a request off the ledger's lease; one thread leases for all when it ran out."""
        budget = self._budget
        ledger = self._one_ledger or budget.ledger_for(entity_key)
        now_ms = int(self._clock() * 1000)
        start = now_ms - now_ms % self._window_ms
        calls = self._calls
        while True:
            with self._lock:
                known = calls.get(call_id) or self._older_calls.get(call_id)
                if known is not None:
                    return known[0]
                now = self._monotonic()
                lease = self._leases.get(ledger)
                if lease is not None and lease.lasts(self._caps, start, now):
                    lease.spent[2] += 1  # the call's request, taken now: a request cap is exact
                    if len(calls) >= MAX_REMEMBERED_CALLS:  # a new generation; one is kept
                        self._older_calls, calls = calls, {}
                        self._calls = calls
                    calls[call_id] = (lease.allowance, False)
                    return lease.allowance
                refused = self._refused.get(ledger)
                if refused is not None and refused[0] == start and now < refused[1]:
                    raise BudgetExceeded(refused[2], ledger=ledger, window_start_ms=start)
                unreachable = self._unreachable.get(ledger)
                if unreachable is not None and now < unreachable[0]:
                    raise unreachable[1]  # asked lately for its whole patience: fail at once
                flight = self._leasing.get(ledger)
                mine = flight is None
                if flight is None:
                    flight = self._leasing[ledger] = _Flight()
            if not mine:
                flight.done.wait()  # another thread is leasing this ledger: share its answer
                if flight.failure is not None:
                    raise flight.failure
                continue
            try:
                answer = self._lease(ledger, lease)  # the RPC, without the lock
            except BudgetUnavailableError as failure:
                flight.failure = failure
                with self._lock:
                    self._unreachable[ledger] = (self._monotonic() + UNREACHABLE_MEMORY_S, failure)
                raise
            finally:
                with self._lock:
                    del self._leasing[ledger]
                flight.done.set()
            with self._lock:
                now = self._monotonic()
                if not answer.lease_id:
                    self._leases.pop(ledger, None)
                    why = _exhausted(budget, ledger, answer)
                    self._refused[ledger] = (answer.window_start_ms, now + REFUSAL_MEMORY_S, why)
                    raise BudgetExceeded(why, ledger=ledger, window_start_ms=answer.window_start_ms)
                self._leases[ledger] = _Lease(
                    allowance_for(ledger, answer.window_start_ms, answer.lease_id),
                    (answer.granted_tokens, answer.granted_cost_micros, answer.granted_requests),
                    now + answer.lease_ms / 1000 * _RENEW_AT,
                )

    def spend(
        self, allowance: Allowance, model: str, response: LlmResponse, call_id: str
    ) -> Charge:
        """Take a call's usage off its lease, once per call; what to debit for it.

        Its cost is priced by the model the request named (a provider may answer with a dated
        snapshot's name).
        """
        usage = response.usage
        tokens = usage.input_tokens + usage.output_tokens
        cost = (
            self._budget.cost_micros(model, usage.input_tokens, usage.output_tokens)
            if self._priced
            else 0
        )
        charge = Charge(allowance, tokens, cost, 1)
        with self._lock:
            known = self._calls.get(call_id) or self._older_calls.get(call_id)
            if known is not None and known[1]:
                return charge  # spent when the provider answered it the first time
            self._calls[call_id] = (allowance, True)
            lease = self._leases.get(allowance.ledger)
            if lease is not None and lease.allowance == allowance:
                lease.spent[0] += tokens
                lease.spent[1] += cost
        return charge

    def close(self) -> None:
        """Give back what the held leases did not spend, and close the channel."""
        with self._lock:
            leases, self._leases = list(self._leases.values()), {}
            try:
                for lease in leases:
                    self._call(self._release_request(lease), patience_s=0)
            except (grpc.RpcError, BudgetUnavailableError) as error:
                _log.info("could not return unspent budget allowances (they lapse): %s", error)
            finally:
                if self._channel is not None:
                    self._channel.close()
                    self._channel = None

    def _lease(self, ledger: str, old: _Lease | None) -> LeaseBudgetResponse:
        budget = self._budget
        request = LeaseBudgetRequest(
            ledger=ledger,
            window_ms=budget.window_ms,
            cap_tokens=budget.tokens or 0,
            cap_cost_micros=budget.cap_cost_micros,
            cap_requests=budget.requests or 0,
            want_tokens=budget.lease_tokens,
            want_cost_micros=budget.lease_cost_micros,
            want_requests=budget.lease_requests,
            owner=self._owner,
        )
        if old is not None:
            request.MergeFrom(self._release_request(old))
        return self._call(request, patience_s=UNREACHABLE_PATIENCE_S)

    def _release_request(self, lease: _Lease) -> LeaseBudgetRequest:
        budget = self._budget
        return LeaseBudgetRequest(
            ledger=lease.allowance.ledger,
            window_ms=budget.window_ms,
            cap_tokens=budget.tokens or 0,
            cap_cost_micros=budget.cap_cost_micros,
            cap_requests=budget.requests or 0,
            owner=self._owner,
            release_lease_id=lease.allowance.lease_id,
            released_spent_tokens=lease.spent[0],
            released_spent_cost_micros=lease.spent[1],
            released_spent_requests=lease.spent[2],
        )

    def _call(self, request: LeaseBudgetRequest, *, patience_s: float) -> LeaseBudgetResponse:
        """One ``LeaseBudget`` call, retried while the effector is unreachable, up to a limit."""
        connection = self._connection
        give_up = self._monotonic() + patience_s
        pause = _FIRST_PAUSE_S
        while True:
            if self._channel is None:
                self._channel = connection.open_channel()
            stub = connection.stub(self._channel)
            try:
                answer: LeaseBudgetResponse = stub.LeaseBudget(
                    request, timeout=_RPC_TIMEOUT_S, metadata=connection.metadata()
                )
                return answer
            except grpc.RpcError as error:
                code = error.code() if isinstance(error, grpc.Call) else None
                if code in _RETRYABLE and pause == _FIRST_PAUSE_S and patience_s:
                    _log.warning(
                        "fleet budget ledger %r at %s: LeaseBudget failed (%s); calls on it "
                        "wait while it is retried for up to %.0f s",
                        request.ledger,
                        connection.target,
                        code.name if code else "error",
                        patience_s,
                    )
                if code not in _RETRYABLE or self._monotonic() + pause > give_up:
                    detail = error.details() if isinstance(error, grpc.Call) else str(error)
                    raise BudgetUnavailableError(
                        f"fleet budget ledger {request.ledger!r} at {connection.target}: "
                        f"LeaseBudget failed ({code.name if code else 'error'}: {detail})"
                    ) from None
                time.sleep(pause)
                pause = min(pause * 2, 1.0)


def _exhausted(budget: Budget, ledger: str, answer: LeaseBudgetResponse) -> str:
    """Why nothing was granted: what the window has debited and leased against its caps."""
    parts = []
    if budget.tokens is not None:
        parts.append(
            f"{answer.debited_tokens} tokens debited and {answer.leased_tokens} leased of "
            f"{budget.tokens}"
        )
    if budget.cost_usd is not None:
        parts.append(
            f"{answer.debited_cost_micros / 1e6:.6f} USD debited and "
            f"{answer.leased_cost_micros / 1e6:.6f} leased of {budget.cost_usd}"
        )
    if budget.requests is not None:
        parts.append(
            f"{answer.debited_requests} requests debited and {answer.leased_requests} leased "
            f"of {budget.requests}"
        )
    return (
        f"fleet budget {ledger!r} is exhausted for the {budget.window} window starting at "
        f"{answer.window_start_ms} ms: {'; '.join(parts)}"
    )
