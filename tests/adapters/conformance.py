# mypy: disallow-untyped-calls=False
"""The conformance suite's loop: a case's agent in a real pipeline with a real effector.

- :func:`run_case_loop`: ``ReadEnvelopes(events) → RunAgent(case agent) → SubmitIntents`` on
  Beam's local runner against an effector subprocess (:class:`tests.semantics.loop.Sidecar`,
  which executes ``apply_effect`` into the gate ledger), while :class:`Approver` decides the
  approval requests as the event keys say (``approve``, ``deny``; ``timeout`` is left alone,
  so the ``HitlPolicy`` route ends that run).
- :func:`run_case_with_retries`: the same envelopes as an effector logged them, replayed by a
  ``TestStream`` on the bundle-based runner with every commit failed once, intents submitted
  to the same effector.

Both are :func:`run_loop` and :func:`run_with_retries` with a case's agent and
``conformance_config``; other suites (``tests/mcp``) run their own agent and config with them.
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner

from beam_agents import AgentConfig, AgentEnvelope, Deny, HitlPolicy, RunAgent
from beam_agents._protos import (
    AgentError,
    IntentDeadLetter,
    IntentState,
    SubmitAck,
    ToolIntent,
    ToolResult,
    TraceEvent,
)
from beam_agents.core.context import AgentFn
from beam_agents.hitl import FallbackContext
from beam_agents.io import EffectorConnection, ReadEnvelopes, SubmitIntents
from beam_agents.testing import EnvelopeStream, FailFirstCommit
from effector.client import EffectorClient
from tests.adapters.scenario import event_payload, triage_registry
from tests.core.harness import SharedProvider
from tests.io.io_harness import Collector, run_pipeline

CASES = {
    "plain": "tests.adapters.cases.plain_case",
    "langgraph": "tests.adapters.cases.langgraph_case",
    "pydantic_ai": "tests.adapters.cases.pydantic_ai_case",
    "adk": "tests.adapters.cases.adk_case",
}
"""Each case's module; its ``triage_agent`` is the agent under test."""

BASE_MS = 1_767_225_600_000
DEADLINE_MS = 6_000
"""How long a run waits for a person before the ``HitlPolicy`` route denies it (long enough
for the approver to answer while the chaos run restarts the effector)."""
APPROVAL_TTL_MS = DEADLINE_MS + 2_000
"""When the effector refuses an unanswered approval request: after the route ended its run
(its ``EXPIRED`` result is then an orphaned result), and so lets the read stop."""
IDLE_S = 2.0
"""The read stops once the effector has had nothing in flight for this long."""
TIMED_OUT = b"TIMED OUT"


def case_agent(case: str) -> AgentFn:
    """The conformance agent of ``case``."""
    agent: AgentFn = importlib.import_module(CASES[case]).triage_agent
    return agent


def conformance_events() -> list[AgentEnvelope]:
    """One event per key: two plain effects, one approved, one denied, one nobody answers."""
    specs = [
        ("plain-1", "acct-ann", 11, False),
        ("plain-2", "acct-bob", 22, False),
        ("approve-1", "acct-cid", 33, True),
        ("deny-1", "acct-dee", 44, True),
        ("timeout-1", "acct-eve", 55, True),
    ]
    return [
        AgentEnvelope(
            entity_key=name.encode(),
            event_time_ms=BASE_MS + 1_000 * index,
            external_event=event_payload(name, account=account, amount=amount, approval=ask),
        )
        for index, (name, account, amount, ask) in enumerate(specs)
    ]


def deny_when_nobody_answers(fallback: FallbackContext) -> Deny:
    """The conformance ``HitlPolicy`` route: end the run with ``TIMED OUT``."""
    return Deny(TIMED_OUT)


def conformance_config(
    provider: SharedProvider, before_commit: Callable[[Any], None] | None = None
) -> AgentConfig:
    """The ``AgentConfig`` every case runs with."""
    return AgentConfig(
        provider_factory=provider,
        tool_registry=triage_registry(),
        hitl_policy=HitlPolicy(
            timeout_ms=DEADLINE_MS,
            intent_ttl_ms=APPROVAL_TTL_MS,
            approval_channel="conformance",
            on_timeout=deny_when_nobody_answers,
        ),
        before_commit=before_commit,
    )


class Approver(threading.Thread):
    """Decides approval requests as their key says: ``approve-*`` yes, ``deny-*`` no."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True, name="conformance-approver")
        self._address = address
        self._stop_event = threading.Event()
        self.decided: dict[str, bool] = {}
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            while not self._stop_event.wait(0.05):
                self._decide_waiting()
        except BaseException as exc:  # re-raised by stop()
            self.failure = exc

    def _decide_waiting(self) -> None:
        try:
            with EffectorClient(self._address) as client:
                waiting = client.list_intents(IntentState.AWAITING_DECISION)
                for intent in waiting:
                    key = intent.entity_key.decode()
                    if intent.intent_id in self.decided or key.startswith("timeout"):
                        continue
                    approved = key.startswith("approve")
                    client.decide(
                        intent.intent_id,
                        approved=approved,
                        approver="conformance",
                        reason="as planned",
                    )
                    self.decided[intent.intent_id] = approved
        except Exception:
            return  # the effector may be restarting; try again on the next tick

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)
        if self.failure is not None:
            raise self.failure


@dataclass
class CaseRun:
    """What one conformance pipeline produced."""

    outputs: list[str]
    """The outputs as text, sorted (``.output`` carries no key)."""
    intents: list[ToolIntent]
    traces: list[TraceEvent]
    errors: list[AgentError]
    dead_letters: list[IntentDeadLetter]
    acks: dict[str, int]
    provider_calls: int
    seconds: float

    def tool_intents(self, tool_name: str) -> list[ToolIntent]:
        return [intent for intent in self.intents if intent.tool_name == tool_name]


def _outputs(values: Sequence[bytes]) -> list[str]:
    return sorted(value.decode("utf-8") for value in values)


def _acks(values: Sequence[SubmitAck]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for ack in values:
        name = SubmitAck.Outcome.Name(ack.outcome)
        counts[name] = counts.get(name, 0) + 1
    return counts


class _Sinks:
    """Collects what a loop pipeline's agent and its submit produce.

    With ``provider``, :attr:`CaseRun.provider_calls` counts the calls its FakeLLM took
    meanwhile (else it is 0).
    """

    def __init__(self, provider: SharedProvider | None = None) -> None:
        self.outputs, self.intents, self.traces, self.errors, self.letters, self.acks = (
            Collector.new() for _ in range(6)
        )
        self._provider = provider
        self._calls_before = self._provider_calls()
        self._started = time.monotonic()

    def _provider_calls(self) -> int:
        return self._provider.fake.call_count if self._provider is not None else 0

    def wire(self, agent: Any, connection: EffectorConnection) -> None:
        """Submit ``agent``'s intents to the effector and collect every output."""
        submitted = agent.intents | "ToEffector" >> SubmitIntents(connection)
        agent.output | "Outputs" >> self.outputs.sink()
        agent.intents | "Intents" >> self.intents.sink()
        agent.traces | "Traces" >> self.traces.sink()
        agent.errors | "Errors" >> self.errors.sink()
        submitted.dead_letter | "DeadLetters" >> self.letters.sink()
        submitted.acks | "Acks" >> self.acks.sink()

    def collected(self) -> CaseRun:
        """What the pipeline produced, once it has finished."""
        return CaseRun(
            outputs=_outputs(self.outputs.values()),
            intents=self.intents.values(),
            traces=self.traces.values(),
            errors=self.errors.values(),
            dead_letters=self.letters.values(),
            acks=_acks(self.acks.values()),
            provider_calls=self._provider_calls() - self._calls_before,
            seconds=time.monotonic() - self._started,
        )


class _Beside(threading.Thread):
    """Runs a function beside the pipeline; :meth:`stop` re-raises what it raised."""

    def __init__(self, function: Callable[[], None]) -> None:
        super().__init__(daemon=True, name="loop-beside")
        self._function = function
        self.failure: BaseException | None = None

    def run(self) -> None:
        try:
            self._function()
        except BaseException as exc:  # re-raised by stop()
            self.failure = exc

    def stop(self) -> None:
        self.join(timeout=60)
        assert not self.is_alive(), "the function beside the pipeline did not finish"
        if self.failure is not None:
            raise self.failure


def run_loop(
    agent: AgentFn,
    config: AgentConfig,
    address: str,
    events: Sequence[AgentEnvelope],
    *,
    provider: SharedProvider | None = None,
    idle_s: float = IDLE_S,
    approve: bool = True,
    during: Callable[[], None] | None = None,
) -> CaseRun:
    """``ReadEnvelopes(events) → RunAgent(agent, config) → SubmitIntents`` until idle.

    The effector at ``address`` executes the intents; the read stops once it has had nothing
    in flight for ``idle_s``. With ``approve``, an :class:`Approver` decides approval requests
    meanwhile. ``during`` runs in a thread alongside the pipeline (a kill-and-restart test);
    what it raises is raised here. ``provider``: the ``SharedProvider`` whose calls to count.
    """
    connection = EffectorConnection(address)
    sinks = _Sinks(provider)

    def build(pipeline: beam.Pipeline) -> None:
        envelopes = pipeline | "Envelopes" >> ReadEnvelopes(
            connection, events=events, stop_when_idle_s=idle_s, poll_wait_ms=50
        )
        sinks.wire(envelopes | "Agent" >> RunAgent(agent, config=config), connection)

    beside: list[Approver | _Beside] = [Approver(address)] if approve else []
    if during is not None:
        beside.append(_Beside(during))
    with ExitStack() as stack:
        for thread in beside:
            thread.start()
            stack.callback(thread.stop)
        run_pipeline(build)
    return sinks.collected()


def run_case_loop(
    case: str,
    address: str,
    provider: SharedProvider,
    *,
    during: Callable[[], None] | None = None,
) -> CaseRun:
    """Run ``case`` over the conformance events through the effector at ``address``.

    ``during`` runs in a thread alongside the pipeline (the kill-and-restart test).
    """
    return run_loop(
        case_agent(case),
        conformance_config(provider),
        address,
        conformance_events(),
        provider=provider,
        during=during,
    )


def logged_envelopes(address: str) -> list[AgentEnvelope]:
    """Every envelope the effector's log holds, oldest first."""
    envelopes: list[AgentEnvelope] = []
    offset = 1
    with EffectorClient(address) as client:
        while records := client.read(offset, max_batch=1_000).records:
            envelopes.extend(record.envelope for record in records)
            offset = records[-1].offset + 1
    return envelopes


def run_with_retries(
    agent: AgentFn,
    config: AgentConfig,
    address: str,
    envelopes: Sequence[AgentEnvelope],
    markers: Path,
    *,
    provider: SharedProvider | None = None,
    advance_ms: int = DEADLINE_MS * 2,
) -> tuple[CaseRun, list[str]]:
    """Replay ``envelopes`` (a loop run's log) with every commit failed once, then retried.

    ``envelopes`` go through a ``TestStream`` on the bundle-based runner, then processing time
    advances ``advance_ms``; ``agent`` runs with ``config`` plus a ``FailFirstCommit`` on
    ``markers``. Returns the run and the commits that were failed. Intents go to the effector
    at ``address``, which has them all already.
    """
    stream = EnvelopeStream().envelopes(envelopes)
    stream.advance_processing_time(advance_ms)
    forcing = FailFirstCommit(markers)
    sinks = _Sinks(provider)
    pipeline = beam.Pipeline(
        runner=BundleBasedDirectRunner(), options=PipelineOptions(streaming=True)
    )
    agent_outputs = (
        pipeline
        | "Stream" >> stream.build()
        | "Agent" >> RunAgent(agent, config=replace(config, before_commit=forcing))
    )
    sinks.wire(agent_outputs, EffectorConnection(address))
    pipeline.run().wait_until_finish()
    return sinks.collected(), forcing.forced()


def run_case_with_retries(
    case: str,
    address: str,
    provider: SharedProvider,
    envelopes: Sequence[AgentEnvelope],
    markers: Path,
) -> tuple[CaseRun, list[str]]:
    """Replay ``envelopes`` (a loop run's log) with every commit failed once, then retried.

    Returns the run and the commits that were failed. Intents go to the effector at
    ``address``, which has them all already.
    """
    return run_with_retries(
        case_agent(case),
        conformance_config(provider),
        address,
        # The HitlPolicy route ended the run an EXPIRED result was for.
        [e for e in envelopes if e.tool_result.status != ToolResult.EXPIRED],
        markers,
        provider=provider,
    )
