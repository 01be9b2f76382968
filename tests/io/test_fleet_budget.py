# mypy: disallow-untyped-calls=False
"""Fleet budgets end to end: a pipeline's model calls leased, admitted and debited exactly once.

An effector in this process keeps the ledger (SQLite). Pipelines run on FnApiRunner: each
event's agent asks a FakeLLM once, and completes with ``over`` when ``BudgetExceeded`` refuses
the call. ``.intents`` (the calls' ``BUDGET_DEBIT`` intents) go to the effector through
``SubmitIntents``.
"""

from __future__ import annotations

import threading
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from beam_agents import (
    AgentConfig,
    AgentEnvelope,
    Budget,
    BudgetExceeded,
    Complete,
    RunAgent,
    SubmitIntents,
    ToolIntent,
)
from beam_agents._protos import LeaseBudgetRequest, debit_id_for
from beam_agents.core.context import ActivationContext
from beam_agents.io.budget_leases import BudgetUnavailableError, LeasedBudget
from beam_agents.model.client import LlmRequest, LlmResponse, TokenUsage
from beam_agents.model.fake import FakeLLM, match_any, respond_with
from beam_agents.testing import EnvelopeStream, FailFirstCommit
from beam_agents.tools import ToolRegistry
from effector import EffectorClient, EffectorThread, ServerSettings
from effector.launch import free_port
from tests.io.io_harness import Collector, run_pipeline

USAGE = TokenUsage(input_tokens=10, output_tokens=5)
PER_CALL = 15
_CALLS: dict[str, int] = {}
_LOCK = threading.Lock()


class CountingFake(FakeLLM):
    """The FakeLLM, counting the provider calls each test's pipeline makes."""

    def __init__(self, token: str) -> None:
        super().__init__([(match_any(), respond_with(b"fine", usage=USAGE))])
        self._token = token

    async def complete(self, request: LlmRequest) -> LlmResponse:
        with _LOCK:
            _CALLS[self._token] = _CALLS.get(self._token, 0) + 1
        return await super().complete(request)


class _Factory:
    def __init__(self, token: str) -> None:
        self.token = token

    def __call__(self) -> CountingFake:
        return CountingFake(self.token)


async def ask_once(ctx: ActivationContext) -> Complete:
    """Ask the model once; say whether the fleet budget let the call through."""
    try:
        await ctx.call_model(LlmRequest(model_id="m", messages=[ctx.event.decode()]))
    except BudgetExceeded as exceeded:
        assert exceeded.ledger
        return Complete(output=b"over")
    return Complete(output=b"ok")


def _events(keys: int, per_key: int) -> list[tuple[bytes, AgentEnvelope]]:
    return [
        (
            f"acme/k{k}".encode(),
            AgentEnvelope(
                entity_key=f"acme/k{k}".encode(),
                event_time_ms=1_000 + n,
                external_event=f"event {n}".encode(),
            ),
        )
        for n in range(per_key)
        for k in range(keys)
    ]


def _run(
    address: str,
    budget: Budget | tuple[Budget, ...],
    events: list[tuple[bytes, AgentEnvelope]],
    *,
    streaming: bool = False,
    **config: object,
) -> tuple[list[bytes], list[ToolIntent], int]:
    token = str(id(budget)) + str(id(events))
    outputs, intents = Collector.new(), Collector.new()
    agent_config = AgentConfig(provider_factory=_Factory(token), budget=budget, **config)  # type: ignore[arg-type]

    def build(pipeline: beam.Pipeline) -> None:
        if streaming:
            stream = EnvelopeStream()
            for _, envelope in events:
                stream.envelope(envelope)
            source = pipeline | stream.build()
        else:
            source = pipeline | beam.Create(events)
        ran = source | RunAgent(ask_once, config=agent_config)
        ran.output | "Outputs" >> outputs.sink()
        ran.intents | "Intents" >> intents.sink()
        ran.intents | SubmitIntents(address)

    if streaming:  # the default runner, which retries a failed bundle
        options = PipelineOptions()
        options.view_as(StandardOptions).streaming = True
        with beam.Pipeline(options=options) as pipeline:
            build(pipeline)
    else:
        run_pipeline(build)
    return outputs.values(), intents.values(), _CALLS.get(token, 0)


def _window(address: str, ledger: str) -> tuple[int, int, int]:
    with EffectorClient(address) as client:
        [window] = [w for w in client.budgets() if w.ledger == ledger]
    return window.debited_tokens, window.debits, window.cap_tokens


def test_calls_past_the_cap_are_refused_and_committed_usage_debited_once(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/effector.db"
    with EffectorThread(store, ToolRegistry()) as effector:
        budget = Budget("fleet-a", effector.address, tokens=300, chunk_tokens=45)
        outputs, intents, calls = _run(effector.address, budget, _events(10, 4))
        debited, debits, cap = _window(effector.address, "fleet-a")
    ok = outputs.count(b"ok")
    assert len(outputs) == 40 and outputs.count(b"over") == 40 - ok
    assert calls == ok  # a refused activation never reached the provider
    debit_intents = [i for i in intents if i.kind == ToolIntent.BUDGET_DEBIT]
    assert len(debit_intents) == ok == debits
    assert debited == ok * PER_CALL  # exactly the committed calls' usage
    assert cap == 300
    # The cap holds up to one call's overshoot per worker holding a lease.
    assert 300 - 2 * PER_CALL <= debited <= 300 + 4 * PER_CALL
    ids = {i.intent_id for i in debit_intents}
    assert len(ids) == ok
    key, seq, step = debit_intents[0].entity_key, debit_intents[0].seq, debit_intents[0].step_index
    assert debit_intents[0].intent_id == debit_id_for(key, seq, step, "fleet-a")


def test_a_retried_commit_debits_once(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/effector.db"
    with EffectorThread(store, ToolRegistry()) as effector:
        budget = Budget("fleet-r", effector.address, tokens=10_000)
        (tmp_path / "markers").mkdir()
        retry = FailFirstCommit(tmp_path / "markers")
        outputs, _, calls = _run(
            effector.address, budget, _events(5, 2), streaming=True, before_commit=retry
        )
        debited, debits, _ = _window(effector.address, "fleet-r")
    assert outputs == [b"ok"] * 10
    assert len(retry.forced()) == 10  # every first commit failed after its call, and ran again
    assert calls == 10  # the retries' calls were answered from the worker's memo
    assert (debited, debits) == (10 * PER_CALL, 10)  # only what committed


def test_a_tenant_separator_gives_each_tenant_its_ledger(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/effector.db"
    globex = AgentEnvelope(entity_key=b"globex/k0", event_time_ms=5, external_event=b"x")
    events = [*_events(2, 2), (b"globex/k0", globex)]
    with EffectorThread(store, ToolRegistry()) as effector:
        budget = Budget("fleet-t", effector.address, tokens=1_000, tenant_separator="/")
        outputs, _, _ = _run(effector.address, budget, events)
        acme = _window(effector.address, "fleet-t/acme")
        other = _window(effector.address, "fleet-t/globex")
    assert outputs == [b"ok"] * 5
    assert (acme[0], other[0]) == (4 * PER_CALL, PER_CALL)


def test_leases_survive_a_restart_and_a_dead_workers_allowance_returns(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/effector.db"
    listen = ServerSettings(listen=f"127.0.0.1:{free_port()}", budget_lease_ms=3_000)
    request = LeaseBudgetRequest(
        ledger="fleet-l", window_ms=86_400_000, cap_tokens=100, want_tokens=60, owner="w1"
    )
    with (
        EffectorThread(store, ToolRegistry(), listen) as effector,
        EffectorClient(effector.address) as client,
    ):
        first = client.lease_budget(request)
        assert (first.granted_tokens, first.leased_tokens) == (60, 60)
        second = client.lease_budget(request)
        assert second.granted_tokens == 40
        assert not client.lease_budget(request).lease_id  # exhausted while both live
    with (
        EffectorThread(store, ToolRegistry(), listen) as effector,  # restarted
        EffectorClient(effector.address) as client,
    ):
        assert not client.lease_budget(request).lease_id  # the leases outlived it
        released = LeaseBudgetRequest()
        released.CopyFrom(request)
        released.release_lease_id = first.lease_id
        released.released_spent_tokens = 10
        again = client.lease_budget(released)  # w1 spent 10 of 60: 50 return now
        assert again.granted_tokens == 50
        threading.Event().wait(3.1)  # every lease lapses: a dead worker's allowance returns
        late = client.lease_budget(request)
        assert (late.granted_tokens, late.leased_tokens, late.debited_tokens) == (60, 60, 0)


def test_an_unreachable_ledger_fails_the_activation_loudly() -> None:
    budget = Budget("fleet-x", f"127.0.0.1:{free_port()}", tokens=100)
    leases = LeasedBudget(budget)
    leases_patience = 0.3
    import beam_agents.io.budget_leases as module

    original = module.UNREACHABLE_PATIENCE_S
    module.UNREACHABLE_PATIENCE_S = leases_patience
    try:
        with pytest.raises(BudgetUnavailableError, match=r"fleet-x.*LeaseBudget failed"):
            leases.admit(b"k", "call-1", "m")
    finally:
        module.UNREACHABLE_PATIENCE_S = original
        leases.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "needs a cap"),
        ({"tokens": 0}, "tokens must be an int from 1"),
        ({"tokens": 10, "window": "1 day"}, "window must be a duration"),
        ({"tokens": 10, "window": "0s"}, "from 1 ms to 366 days"),
        ({"cost_usd": 5.0}, "needs prices"),
        ({"tokens": 10, "tenant_separator": ""}, "tenant_separator"),
        ({"tokens": 10, "prices": {"m": (1.0,)}}, "Budget.prices maps"),
        ({"tokens": 10**30}, r"Budget.tokens must be an int from 1 to 2\*\*53"),
        ({"cost_usd": 1e12, "prices": {"m": (1.0, 1.0)}}, "2\\*\\*53 millionths at most"),
    ],
)
def test_a_bad_budget_is_refused_when_built(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Budget("b", "127.0.0.1:1", **kwargs)  # type: ignore[arg-type]


def test_a_budget_with_a_bad_effector_is_refused_by_run_agent() -> None:
    budget = Budget("b", effector=42, tokens=10)
    with pytest.raises(TypeError, match=r"Budget\.effector must be"):
        RunAgent(ask_once, config=AgentConfig(budget=budget))


def test_a_request_rate_limit_and_a_token_budget_hold_together(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/effector.db"
    with EffectorThread(store, ToolRegistry()) as effector:
        rate = Budget("provider-rpm", effector.address, requests=6, window="1h")
        tokens = Budget("fleet-both", effector.address, tokens=10_000)
        outputs, intents, calls = _run(effector.address, (tokens, rate), _events(3, 4))
        with EffectorClient(effector.address) as client:
            windows = {window.ledger: window for window in client.budgets()}
    assert sorted(outputs) == [b"ok"] * 6 + [b"over"] * 6  # each call takes a whole request
    assert calls == 6
    limited, spent = windows["provider-rpm"], windows["fleet-both"]
    assert (limited.cap_requests, limited.debited_requests, limited.debited_tokens) == (6, 6, 90)
    assert (spent.debited_tokens, spent.debited_requests, spent.debits) == (90, 6, 6)
    debits = [i for i in intents if i.kind == ToolIntent.BUDGET_DEBIT]
    assert len(debits) == 12 and len({i.intent_id for i in debits}) == 12  # one per budget


def test_concurrent_calls_take_whole_requests_and_lease_once(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/effector.db"
    with EffectorThread(store, ToolRegistry()) as effector:
        leases = LeasedBudget(Budget("rpm-1", effector.address, requests=1, window="1h"))
        flights = []
        lease = leases._lease

        def counted(ledger: str, old: object) -> object:
            flights.append(ledger)
            return lease(ledger, old)  # type: ignore[arg-type]

        leases._lease = counted  # type: ignore[method-assign]
        admitted, refused = [], []
        start = threading.Barrier(8)

        def call(n: int) -> None:
            start.wait()
            try:
                admitted.append(leases.admit(b"k", f"call-{n}", "m"))
            except BudgetExceeded:
                refused.append(n)

        threads = [threading.Thread(target=call, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        leases.close()
    assert (len(admitted), len(refused)) == (1, 7)  # a request cap holds under concurrency
    assert len(flights) <= 2  # one thread leases for all; the rest wait for its answer


def test_an_unreachable_ledger_is_asked_once_for_every_waiting_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import beam_agents.io.budget_leases as module

    monkeypatch.setattr(module, "UNREACHABLE_PATIENCE_S", 0.3)
    leases = LeasedBudget(Budget("fleet-y", f"127.0.0.1:{free_port()}", tokens=100))
    failures: list[BaseException] = []
    start = threading.Barrier(4)

    def call(n: int) -> None:
        start.wait()
        try:
            leases.admit(b"k", f"call-{n}", "m")
        except BudgetUnavailableError as failure:
            failures.append(failure)

    threads = [threading.Thread(target=call, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    leases.close()
    assert len(failures) == 4
    assert len({id(failure) for failure in failures}) == 1  # one flight's failure, shared


def test_cost_is_priced_by_the_model_the_request_named(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/effector.db"
    dated = LlmResponse(response=b"x", usage=TokenUsage(1_000, 500), model="gpt-4o-2024-08-06")
    with EffectorThread(store, ToolRegistry()) as effector:
        budget = Budget("priced", effector.address, cost_usd=10.0, prices={"gpt-4o": (2.5, 10.0)})
        leases = LeasedBudget(budget)
        allowance = leases.admit(b"k", "call-1", "gpt-4o")
        charge = leases.spend(allowance, "gpt-4o", dated, "call-1")
        with pytest.raises(ValueError, match=r"no price for model 'gpt-5'"):
            leases.admit(b"k", "call-2", "gpt-5")  # refused before the provider is called
        leases.close()
    assert (charge.tokens, charge.cost_micros) == (1_500, 7_500)  # 1,000 x 2.5 + 500 x 10


async def ask_uncaught(ctx: ActivationContext) -> Complete:
    """Ask the model once and let ``BudgetExceeded`` fail the activation."""
    await ctx.call_model(LlmRequest(model_id="m", messages=[ctx.event.decode()]))
    return Complete(output=b"ok")


def test_an_uncaught_refusal_is_a_budget_exceeded_error(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/effector.db"
    errors = Collector.new()
    with EffectorThread(store, ToolRegistry()) as effector:
        budget = Budget("fleet-u", effector.address, requests=1, window="1h")
        config = AgentConfig(provider_factory=_Factory("uncaught"), budget=budget)

        def build(pipeline: beam.Pipeline) -> None:
            ran = pipeline | beam.Create(_events(1, 2)) | RunAgent(ask_uncaught, config=config)
            ran.errors | errors.sink()

        run_pipeline(build)
    [error] = errors.values()
    assert error.reason == "budget_exceeded"
    assert "fleet budget 'fleet-u' is exhausted" in error.detail


def test_hostile_tenants_get_printable_distinct_ledgers() -> None:
    budget = Budget("desk", "127.0.0.1:1", tokens=10, tenant_separator="/")
    ledgers = [
        budget.ledger_for(key)
        for key in (
            b"\x00acme/1",
            "acme\u202e/1".encode(),
            b"\xff\xfe/1",
            b"x" * 4_000,
            b"x" * 3_999,
        )
    ]
    assert all(ledger.isprintable() and len(ledger) <= 512 for ledger in ledgers)
    assert ledgers[0] == "desk/\\x00acme" and ledgers[1] == "desk/acme\\u202e"
    assert len(set(ledgers)) == len(ledgers)  # cut tenants stay apart by their digest


def test_after_a_whole_patience_unreachable_calls_fail_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import beam_agents.io.budget_leases as module

    monkeypatch.setattr(module, "UNREACHABLE_PATIENCE_S", 0.2)
    leases = LeasedBudget(Budget("fleet-z", f"127.0.0.1:{free_port()}", tokens=100))
    with pytest.raises(BudgetUnavailableError) as first:
        leases.admit(b"k", "call-1", "m")
    asked = leases._lease
    leases._lease = lambda *_: pytest.fail("asked the unreachable effector again")  # type: ignore[method-assign]
    with pytest.raises(BudgetUnavailableError) as second:
        leases.admit(b"k", "call-2", "m")
    assert second.value is first.value
    leases._lease = asked  # type: ignore[method-assign]
    leases.close()
