# mypy: disallow-untyped-calls=False
"""The full loop the crash, replica and clock gates drive: effector subprocesses plus a pipeline.

- :class:`Sidecar`: one effector subprocess (``python -m effector serve``) on a fixed
  127.0.0.1 port, executing the gate tools (:mod:`tests.semantics.gate_tools`, or those its
  ``tools_spec`` names), that can be SIGKILLed and restarted on the same store and the same
  port; every incarnation is stopped when the sidecar is closed, including when the gate fails.
- :func:`run_loop`: the loop pipeline on Beam's ``FnApiRunner``:
  ``ReadEnvelopes(events) → RunAgent(settle) → SubmitIntents``, stopping once the effector
  is idle; returns what it produced.
- :func:`settle`: the loop's agent. Each event stages one ``apply_effect`` intent (or, when
  the event asks for it, an approval) and suspends; the result resumes it and it completes
  with one JSON line saying how the event ended.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import apache_beam as beam
from effector_harness import EffectorProcess, cli_environment

from beam_agents import AgentConfig, RunAgent
from beam_agents._protos import (
    AgentEnvelope,
    AgentError,
    IntentDeadLetter,
    SubmitAck,
    ToolResult,
    canonical_json,
    canonical_json_bytes,
)
from beam_agents.core.agent import Complete, Suspend, intent_id_for
from beam_agents.core.context import ActivationContext
from beam_agents.io import EffectorConnection, ReadEnvelopes, SubmitIntents
from effector.client import EffectorClient
from tests.io.io_harness import Collector, run_pipeline
from tests.semantics.gate_tools import LEDGER_ENV, REGISTRY_SPEC, Ledger

EFFECT_TTL_MS = 3_600_000
"""The TTL of every ``apply_effect`` intent: one hour."""
GATE_EVENTS = 5_000
GATE_KEYS = 500
"""The crash and replica gates' load: 5,000 events on 500 keys (ten runs per key)."""
BASE_EVENT_TIME_MS = 1_767_225_600_000
DEFAULT_SEED = 4_711


def gate_seed() -> int:
    """The seed of the kill schedule: ``GATE_SEED`` from the environment, else a fixed one."""
    return int(os.environ.get("GATE_SEED", DEFAULT_SEED))


def kill_thresholds(rng: random.Random, kills: int, invocations: int) -> list[int]:
    """``kills`` distinct invocation counts between 10% and 85% of ``invocations``, sorted."""
    return sorted(rng.sample(range(invocations // 10, invocations * 85 // 100), kills))


def effect_intent_id(index: int, n_keys: int) -> str:
    """The id of the intent event ``index`` of :func:`make_events` stages: its key's run
    ``index // n_keys``, step 0."""
    return intent_id_for(f"key-{index % n_keys:04d}".encode(), index // n_keys, 0)


def make_events(
    n_events: int,
    n_keys: int,
    *,
    base_ms: int,
    approvals: Sequence[int] = (),
    approval_ttl_ms: int = 0,
) -> list[AgentEnvelope]:
    """``n_events`` events spread round-robin over ``n_keys`` keys, one second apart.

    Events whose index is in ``approvals`` ask for an approval with ``approval_ttl_ms``
    instead of an effect.
    """
    events = []
    for index in range(n_events):
        key = f"key-{index % n_keys:04d}"
        payload: dict[str, object] = {"id": f"e-{index:05d}", "amount": index % 97 + 1}
        if index in approvals:
            payload["approval_ttl_ms"] = approval_ttl_ms
        events.append(
            AgentEnvelope(
                entity_key=key.encode(),
                event_time_ms=base_ms + 1_000 * index,
                external_event=canonical_json(payload).encode(),
            )
        )
    return events


async def settle(ctx: ActivationContext) -> Complete | Suspend:
    """Stage the event's effect (or approval), suspend, and report how it ended on resume."""
    if not ctx.is_resume:
        event = json.loads(ctx.event)
        if "approval_ttl_ms" in event:
            ctx.request_approval(
                {"event_id": event["id"], "amount": event["amount"]},
                ttl_ms=event["approval_ttl_ms"],
            )
        else:
            ctx.act(
                "apply_effect",
                {"event_id": event["id"], "amount": event["amount"]},
                ttl_ms=EFFECT_TTL_MS,
            )
        return Suspend(snapshot=ctx.event)
    event = json.loads(ctx.snapshot)
    report: dict[str, object] = {"event_id": event["id"], "key": ctx.entity_key.decode()}
    if ctx.resume_approval is not None:
        report["outcome"] = "approved" if ctx.resume_approval.approved else "denied"
    else:
        result = ctx.resume_result
        assert result is not None
        report["intent_id"] = result.intent_id
        report["status"] = ToolResult.Status.Name(result.status)
        # Fail closed: anything but a successful effect (an expired intent or approval
        # included) takes the fallback.
        report["outcome"] = "applied" if result.status == ToolResult.OK else "fallback"
    return Complete(output=canonical_json_bytes(report))


@dataclass
class LoopRun:
    """What one run of the loop pipeline produced."""

    outputs: list[dict[str, object]]
    errors: list[AgentError]
    dead_letters: list[IntentDeadLetter]
    acks: Counter[str]
    """Submit acknowledgements by outcome name."""
    seconds: float

    def outputs_by_event(self) -> Counter[str]:
        """How many outputs each event got."""
        return Counter(str(output["event_id"]) for output in self.outputs)

    def sorted_lines(self) -> list[str]:
        """The outputs as canonical JSON lines, sorted (for comparing runs)."""
        return sorted(canonical_json(output) for output in self.outputs)


def run_loop(
    connection: EffectorConnection,
    events: list[AgentEnvelope],
    *,
    idle_s: float = 2.0,
) -> LoopRun:
    """Run the loop over ``events`` until the effector has been idle ``idle_s``.

    ``SubmitIntents`` keeps its default retries: they must ride out an effector restart.
    """
    outputs, errors, letters, acks = (Collector.new() for _ in range(4))

    def build(pipeline: beam.Pipeline) -> None:
        envelopes = pipeline | "Envelopes" >> ReadEnvelopes(
            connection, events=events, stop_when_idle_s=idle_s, poll_wait_ms=50
        )
        agent = envelopes | "Settle" >> RunAgent(settle, config=AgentConfig())
        submitted = agent.intents | "ToEffector" >> SubmitIntents(connection)
        agent.output | "Outputs" >> outputs.sink()
        agent.errors | "Errors" >> errors.sink()
        submitted.dead_letter | "DeadLetters" >> letters.sink()
        submitted.acks | "Acks" >> acks.sink()

    started = time.monotonic()
    run_pipeline(build)
    return LoopRun(
        outputs=[json.loads(raw) for raw in outputs.values()],
        errors=errors.values(),
        dead_letters=letters.values(),
        acks=Counter(SubmitAck.Outcome.Name(ack.outcome) for ack in acks.values()),
        seconds=time.monotonic() - started,
    )


@dataclass
class Sidecar:
    """An effector subprocess on a fixed port that can be killed and restarted in place."""

    store_url: str
    port: int
    ledger: Path
    extra_args: tuple[str, ...] = ()
    tools_spec: str = REGISTRY_SPEC
    """What ``--tools`` loads: the gate tools unless told otherwise."""
    environment: dict[str, str] | None = None
    """The incarnations' environment (over ``cli_environment``); ``None``: the gate ledger's,
    ``LEDGER_ENV`` set to :attr:`ledger`."""
    killed: list[int] = field(default_factory=list)
    """The process ids of the incarnations SIGKILLed so far."""
    pids: list[int] = field(default_factory=list)
    logs: list[str] = field(default_factory=list)
    """What each incarnation that has exited wrote on stdout and stderr."""
    _process: EffectorProcess | None = None

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``, the same for every incarnation."""
        return f"127.0.0.1:{self.port}"

    @property
    def console_url(self) -> str | None:
        """The running incarnation's web console (with ``--console-listen``), if any."""
        assert self._process is not None, "not running"
        return self._process.console_url

    def start(self) -> None:
        """Start an incarnation on the store and port; returns once it is serving."""
        assert self._process is None, "already running"
        environment = (
            {LEDGER_ENV: str(self.ledger)} if self.environment is None else self.environment
        )
        self._process = EffectorProcess(
            *("--tools", self.tools_spec, "--store", self.store_url),
            *("--listen", self.address, *self.extra_args),
            env=cli_environment(**environment),
        )
        self.pids.append(self._process.process.pid)

    def kill(self) -> None:
        """SIGKILL the running incarnation and reap it."""
        process = self._process
        assert process is not None, "not running"
        process.signal(signal.SIGKILL)
        self.killed.append(process.process.pid)
        assert process.wait() == -signal.SIGKILL
        self._retire(process)
        self._process = None

    def stop(self) -> None:
        """Drain the running incarnation with SIGTERM (SIGKILL if it hangs); idempotent."""
        process, self._process = self._process, None
        if process is None:
            return
        try:
            process.signal(signal.SIGTERM)
            process.wait(timeout_s=30)
        finally:
            self._retire(process)

    def _retire(self, process: EffectorProcess) -> None:
        """Keep an exited incarnation's output in :attr:`logs`; release its files."""
        if process.process.poll() is not None:
            assert process.process.stdout is not None
            self.logs.append(process.process.stdout.read() + process.stderr())
        process.__exit__(None, None, None)

    @property
    def pid(self) -> int:
        """The running incarnation's process id."""
        assert self._process is not None, "not running"
        return self._process.process.pid


SidecarT = TypeVar("SidecarT", bound=Sidecar)


@contextmanager
def started(running: SidecarT) -> Iterator[SidecarT]:
    """``running`` (a :class:`Sidecar` or a subclass) started, stopped on exit whatever happened."""
    try:
        running.start()
        yield running
    finally:
        running.stop()


def sidecar(
    store_url: str, port: int, ledger: Path, *extra_args: str
) -> AbstractContextManager[Sidecar]:
    """A started :class:`Sidecar` serving the gate tools, stopped on exit whatever happened."""
    return started(Sidecar(store_url, port, ledger, extra_args))


class Chaos(threading.Thread):
    """SIGKILLs sidecars while the loop runs, and restarts each after a short random outage.

    ``plan`` lists ``(invocations, sidecar)``: once the ledger holds that many raw tool
    invocations, that sidecar is killed. Progress, not time, places the kills, so each lands
    while work is under way whatever the machine's speed; the RNG adds up to half a second of
    downtime before the restart. Failures inside the thread are re-raised by :meth:`finish`.
    """

    def __init__(
        self,
        sidecars: Sequence[Sidecar],
        ledger: Path,
        plan: Sequence[tuple[int, int]],
        rng: random.Random,
    ) -> None:
        super().__init__(daemon=True, name="gate-chaos")
        self._sidecars = sidecars
        self._ledger = ledger
        self._plan = sorted(plan)
        self._rng = rng
        self._stop_event = threading.Event()
        self._failure: BaseException | None = None
        self.done = 0

    def run(self) -> None:
        try:
            for threshold, which in self._plan:
                while _invocation_count(self._ledger) < threshold:
                    if self._stop_event.wait(0.01):
                        return
                self._sidecars[which].kill()
                time.sleep(self._rng.uniform(0.0, 0.5))
                self._sidecars[which].start()
                self.done += 1
        except BaseException as exc:  # re-raised in the test's thread by finish()
            self._failure = exc

    def finish(self) -> None:
        """Stop waiting for further thresholds; re-raise what went wrong in the thread."""
        self._stop_event.set()
        self.join(timeout=60)
        if self._failure is not None:
            raise self._failure


def _invocation_count(ledger: Path) -> int:
    with closing(sqlite3.connect(ledger, timeout=60)) as connection:
        (count,) = connection.execute("SELECT COUNT(*) FROM invocations").fetchone()
    return int(count)


@dataclass(frozen=True)
class EffectFigures:
    """What the ledger says about the effects of a set of intents."""

    intents: int
    invocations: int
    reexecuted: int
    """Intents whose tool was invoked more than once."""
    extra_invocations: int
    """Invocations beyond one per intent."""
    duplicate_effects: int
    """Effects beyond one per intent, or per event."""


def check_effects(ledger: Path, intent_ids: set[str], killed: Sequence[int]) -> EffectFigures:
    """Assert the once-per-intent promise over the ledger; return its figures.

    Every intent was invoked; an invocation beyond the first happens only when an earlier one
    ran in an effector incarnation that was then killed (the duplicate window: started, not
    recorded), at most once per killed incarnation, so never more often than there were
    kills; and the idempotent ledger applied exactly one effect per intent and per event.
    """
    recorded = Ledger.read(ledger)
    by_intent: dict[str, list[int]] = defaultdict(list)
    for invocation in sorted(recorded.invocations, key=lambda row: row.at_ns):
        by_intent[invocation.intent_id].append(invocation.pid)
    assert set(by_intent) == intent_ids, "invoked intents differ from the submitted ones"
    reexecuted = 0
    for intent_id, pids in by_intent.items():
        if len(pids) == 1:
            continue
        reexecuted += 1
        earlier = pids[:-1]
        assert set(earlier) <= set(killed), f"{intent_id} ran again without a kill: {pids}"
        assert len(set(earlier)) == len(earlier), f"{intent_id} ran twice in one process"
        assert len(earlier) <= len(killed)
    duplicate_effects = sum(n - 1 for n in recorded.effects.values()) + sum(
        n - 1 for n in recorded.effect_details.values()
    )
    assert set(recorded.effects) == intent_ids
    return EffectFigures(
        intents=len(intent_ids),
        invocations=len(recorded.invocations),
        reexecuted=reexecuted,
        extra_invocations=len(recorded.invocations) - len(by_intent),
        duplicate_effects=duplicate_effects,
    )


def check_terminal_results(
    client: EffectorClient, intent_ids: set[str], status: ToolResult.Status
) -> int:
    """Assert that the effector holds exactly one terminal result per intent, with ``status``.

    Every intent is DONE and nothing is in flight, and however often a result was published
    (a redelivery repeats it byte for byte) each intent has one result. Returns how many
    result envelopes the log holds (publications plus redeliveries).
    """
    counts = client.status()
    assert (counts.in_flight, counts.done) == (0, len(intent_ids)), counts
    results: dict[str, set[bytes]] = defaultdict(set)
    published = 0
    offset = 1
    while records := client.read(offset, max_batch=5_000).records:
        for record in records:
            if record.envelope.HasField("tool_result"):
                published += 1
                result = record.envelope.tool_result
                results[result.intent_id].add(result.SerializeToString(deterministic=True))
        offset = records[-1].offset + 1
    assert set(results) == intent_ids, "published results differ from the submitted intents"
    for intent_id, distinct in results.items():
        assert len(distinct) == 1, f"intent {intent_id} has {len(distinct)} different results"
        [only] = distinct
        assert ToolResult.FromString(only).status == status, ToolResult.FromString(only)
    return published


def run_with_chaos(
    sidecars: Sequence[Sidecar],
    plan: Sequence[tuple[int, int]],
    rng: random.Random,
    connection: EffectorConnection,
    events: list[AgentEnvelope],
) -> LoopRun:
    """Run the loop while :class:`Chaos` carries out ``plan``; assert every kill happened."""
    ledger = sidecars[0].ledger
    chaos = Chaos(sidecars, ledger, plan, rng)
    chaos.start()
    try:
        run = run_loop(connection, events)
    finally:
        chaos.finish()
    assert chaos.done == len(plan), f"only {chaos.done} of {len(plan)} kills happened"
    return run


def check_nothing_lost(run: LoopRun, intent_ids: set[str]) -> int:
    """Assert one ``applied`` output per event, for the intents minted; nothing dead-lettered.

    ``.errors`` may hold only results delivered twice: a Submit that a kill cut off is
    retried, and if the restarted effector finished the intent meanwhile, the retry's
    redelivery publishes its result again, which ``RunAgent`` refuses as an orphaned result.
    Returns how many such refusals there were.
    """
    assert run.dead_letters == []
    assert len(run.outputs) == len(intent_ids)
    assert set(run.outputs_by_event().values()) == {1}
    assert {str(output["intent_id"]) for output in run.outputs} == intent_ids
    assert {output["outcome"] for output in run.outputs} == {"applied"}
    for error in run.errors:
        assert error.reason == "orphaned_result", (error.reason, error.detail)
        assert any(
            why in error.detail for why in ("duplicate delivery", "no suspended run", "not pending")
        ), error.detail
    return len(run.errors)


def check_replay(first: LoopRun, second: LoopRun, ledger: Path, invocations_before: int) -> int:
    """Assert a replay from fresh state reproduced ``first`` and executed nothing new.

    Returns the number of tool invocations it added (asserted zero).
    """
    added = len(Ledger.read(ledger).invocations) - invocations_before
    assert added == 0, f"the second run executed {added} tool invocation(s)"
    assert second.errors == [] and second.dead_letters == []
    assert dict(second.acks) == {"DUPLICATE": len(first.outputs)}
    assert second.sorted_lines() == first.sorted_lines()
    return added
