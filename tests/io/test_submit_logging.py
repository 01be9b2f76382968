"""SubmitIntents says what goes wrong, in the log; a run whose intent it cannot deliver moves on."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import apache_beam as beam
import grpc
import pytest
from effector_harness import BackgroundEffector, make_intent

from beam_agents import AgentConfig, Complete, Deny, HitlPolicy, RunAgent, Suspend
from beam_agents._protos import AgentEnvelope, SubmitAck, ToolIntent
from beam_agents.core.agent import intent_id_for
from beam_agents.core.context import ActivationContext
from beam_agents.core.observability import LogBudget
from beam_agents.hitl import FallbackContext
from beam_agents.io import ReadEnvelopes, SubmitIntents, run_agent
from beam_agents.io.run_agent import _bounded
from effector.client import EffectorClient
from effector.launch import free_port
from tests.io.io_harness import Collector, counter, record_intent, run_pipeline, submit_all

LOGGER = "beam_agents.io.effector_link"


def submit_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """What SubmitIntents logged at WARNING or above (dead letters are ERROR lines)."""
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == LOGGER and record.levelno >= logging.WARNING
    ]


def test_each_dead_letter_logs_a_warning_with_the_intent_id_and_the_reason(
    effector: BackgroundEffector, caplog: pytest.LogCaptureFixture
) -> None:
    unknown_tool = make_intent("missing", key=b"acct-7")
    accepted = record_intent(b"acct-8", "fine")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _, letters, _ = submit_all([unknown_tool, accepted], SubmitIntents(effector.address))
    [letter] = letters
    [line] = submit_warnings(caplog)
    assert unknown_tool.intent_id in line
    assert "key acct-7" in line and "tool 'missing'" in line
    assert "REJECTED" in line and letter.reason in line
    assert "unknown tool 'missing'" in line
    assert accepted.intent_id not in caplog.text


def test_every_dead_letter_logs_its_own_error_line_even_when_nobody_reads_the_output(
    effector: BackgroundEffector, caplog: pytest.LogCaptureFixture
) -> None:
    """Forty dead letters, none read downstream: forty ERROR lines, one per intent id."""
    intents = [make_intent("missing", key=f"k\u202e{i}".encode()) for i in range(40)]
    transform = SubmitIntents(effector.address)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        result = run_pipeline(lambda pipeline: pipeline | beam.Create(intents) | transform)
    assert counter(result, "intents_dead_lettered") == 40
    errors = [
        record.getMessage()
        for record in caplog.records
        if record.name == LOGGER and record.levelno == logging.ERROR
    ]
    assert len(errors) == 40
    for intent in intents:
        [line] = [line for line in errors if intent.intent_id in line]
        assert "REJECTED" in line and "unknown tool 'missing'" in line
        assert "0x" + intent.entity_key.hex() in line  # a key with U+202E is shown as hex
        assert "publishes a REJECTED result, which resumes the run waiting for it" in line
        assert "deadline route" not in line


def test_each_dead_letter_line_says_what_its_cause_means_for_the_waiting_run(
    effector: BackgroundEffector, caplog: pytest.LogCaptureFixture
) -> None:
    """Recorded REJECTED, a conflict, and refusals the effector cannot even record."""
    kept = make_intent("record", {"note": "kept"}, key="acct-\u202e1".encode())
    conflicting = make_intent("record", {"note": "other \x1b[2J"}, key=kept.entity_key)
    unknown_tool = make_intent("missing", key=b"acct-2")
    bad_time = make_intent("record", {"note": "x"}, key=b"acct-3", created_at_ms=2**62)
    far_expiry = make_intent("record", {"note": "x"}, key=b"acct-4")
    far_expiry.expires_at_ms = 253_402_300_800_000  # 10000-01-01, past year 9999
    too_deep = make_intent("record", "[" * 65 + "]" * 65, key=b"acct-5")
    too_long = make_intent("\u202e" * 4_097, key=b"acct-6")
    with EffectorClient(effector.address) as client:
        [first] = client.submit([kept])
    assert first.outcome == SubmitAck.ACCEPTED
    refused = [conflicting, unknown_tool, bad_time, far_expiry, too_deep, too_long]
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        _, letters, _ = submit_all(refused, SubmitIntents(effector.address))
    assert len(letters) == len(refused)
    lines = submit_warnings(caplog)

    def line_of(intent: ToolIntent) -> str:
        [line] = [line for line in lines if f"dead letter for intent {intent.intent_id} " in line]
        return line

    conflict = line_of(conflicting)
    assert "conflict" in conflict
    assert "keeps the intent first recorded under this id" in conflict
    assert "publishes a REJECTED result to the run that staged this one" in conflict
    assert "deadline route" not in conflict and "never runs" not in conflict
    rejected = line_of(unknown_tool)
    assert "it never runs: the effector publishes a REJECTED result" in rejected
    assert "deadline route" not in rejected
    for unrecorded in (bad_time, far_expiry, too_deep, too_long):
        line = line_of(unrecorded)
        assert "the effector recorded and publishes nothing" in line, line
        assert "the run waiting for it takes its deadline route" in line
        assert "publishes a REJECTED" not in line
    assert "outside years 1-9999" in line_of(bad_time)
    assert "nested too deeply" in line_of(too_deep)


def test_the_log_budget_allows_lines_per_window_and_summarizes_the_rest() -> None:
    now = [0.0]
    budget = LogBudget(2, 10.0, clock=lambda: now[0])
    assert [budget.allow() for _ in range(5)] == [True, True, False, False, False]
    assert budget.take_suppressed() == 0  # the window is not over: summarize later
    now[0] = 10.0
    assert budget.take_suppressed() == 3  # a new window: the count is due, once
    assert budget.take_suppressed(final=True) == 0
    assert [budget.allow() for _ in range(3)] == [True, True, False]
    assert budget.take_suppressed(final=True) == 1


def test_each_retry_to_an_unreachable_effector_logs_the_target_and_the_next_delay(
    caplog: pytest.LogCaptureFixture,
) -> None:
    target = f"127.0.0.1:{free_port()}"
    transform = SubmitIntents(
        target, max_attempts=3, initial_backoff_s=0.01, max_backoff_s=0.02, rpc_timeout_s=5
    )
    never = record_intent(b"k", "never")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _, letters, result = submit_all([never], transform)
    assert len(letters) == 1
    lines = submit_warnings(caplog)
    retries = [line for line in lines if "retrying in" in line]
    assert len(retries) == 2 == counter(result, "submit_retries")
    pattern = (
        rf"submitting 1 intent\(s\) to the effector at {re.escape(target)} failed "
        r"\(attempt [12] of 3: UNAVAILABLE: .*\); retrying in 0\.0[0-2] s"
    )
    assert all(re.search(pattern, line) for line in retries), retries
    [dead] = [line for line in lines if "dead letter for intent" in line]
    assert never.intent_id in dead and "failed after 3 attempt(s): UNAVAILABLE" in dead


class _Refused(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__()
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "not allowed"


class _RefusedCall:
    """A finished call that failed, as ``Submit.future`` returns it."""

    def __init__(self, error: grpc.RpcError) -> None:
        self._error = error

    def done(self) -> bool:
        return True

    def result(self) -> None:
        raise self._error


class _RefusingSubmit:
    """The stub's ``Submit``: every call, waited for or not, is refused with ``code``."""

    def __init__(self, code: grpc.StatusCode) -> None:
        self.code = code
        self.calls = 0

    def __call__(self, *args: object, **kwargs: object) -> None:
        self.calls += 1
        raise _Refused(self.code)

    def future(self, *args: object, **kwargs: object) -> _RefusedCall:
        self.calls += 1
        return _RefusedCall(_Refused(self.code))


class _RefusingStub:
    def __init__(self, code: grpc.StatusCode) -> None:
        self.Submit = _RefusingSubmit(code)


@pytest.mark.parametrize(
    "code", [grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED]
)
def test_an_auth_failure_raises_permission_error_at_once(code: grpc.StatusCode) -> None:
    fn = SubmitIntents("127.0.0.1:1", max_attempts=5)._fn
    fn.setup()
    try:
        stub = _RefusingStub(code)
        fn._stub = stub
        fn.start_bundle()
        outputs: Iterator[object] = fn.process(record_intent(b"k", "x"))
        assert list(outputs) == []
        with pytest.raises(PermissionError, match=f"{code.name}: not allowed") as failure:
            list(fn.finish_bundle())
        assert "check the token" in str(failure.value)
        assert stub.Submit.calls == 1
    finally:
        fn.teardown()


# -- a dead-lettered intent: loud, and its run takes its deadline route -----------------------
def deny_unanswered(fallback: FallbackContext) -> Deny:
    return Deny(b"denied " + fallback.snapshot)


async def records_then_waits(ctx: ActivationContext) -> Complete | Suspend:
    if ctx.is_resume:
        return Complete(output=b"resumed")
    ctx.act("record", {"note": ctx.event.decode()})
    return Suspend(snapshot=ctx.event)


def test_a_run_whose_intent_is_dead_lettered_takes_its_deadline_route(
    effector: BackgroundEffector, caplog: pytest.LogCaptureFixture
) -> None:
    """Events come from a real effector; the intents go to an address nobody listens on."""
    unreachable = f"127.0.0.1:{free_port()}"
    policy = HitlPolicy(
        timeout_ms=1_500, intent_ttl_ms=60_000, approval_channel="", on_timeout=deny_unanswered
    )
    event = AgentEnvelope(entity_key=b"acct-9", event_time_ms=1_000, external_event=b"order-9")
    output, letters = Collector.new(), Collector.new()

    def build(pipeline: beam.Pipeline) -> None:
        events = pipeline | ReadEnvelopes(
            effector.address, events=[event], stop_when_idle_s=2.0, poll_wait_ms=50
        )
        outputs = events | RunAgent(records_then_waits, AgentConfig(hitl_policy=policy))
        submitted = outputs.intents | SubmitIntents(
            unreachable, max_attempts=2, initial_backoff_s=0.01, max_backoff_s=0.02
        )
        submitted.dead_letter | "Letters" >> letters.sink()
        outputs.output | "Output" >> output.sink()

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        run_pipeline(build)
    assert output.values() == [b"denied order-9"]
    staged = intent_id_for(b"acct-9", 0, 0)
    dead = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    [line] = [line for line in dead if f"dead letter for intent {staged} " in line]
    assert "key acct-9" in line and "failed after 2 attempt(s): UNAVAILABLE" in line
    assert "takes its deadline route" in line
    # The deny route withdraws the intent; that notice cannot be delivered either, and says so.
    kinds = sorted(ToolIntent.Kind.Name(letter.intent.kind) for letter in letters.values())
    assert kinds == ["TOOL", "WITHDRAWAL"]


async def records_and_waits_without_timeout(ctx: ActivationContext) -> Complete | Suspend:
    if ctx.is_resume:
        return Complete(output=b"resumed")
    ctx.act("record", {"note": ctx.event.decode()}, ttl_ms=500)
    return Suspend(snapshot=ctx.event)


def test_a_run_with_no_timeout_whose_intent_is_dead_lettered_is_not_stranded(
    effector: BackgroundEffector,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No Suspend timeout, no policy: the intent's TTL plus the grace still ends the wait.

    After the read stops, the pipeline waits out the deadline and says so.
    """
    monkeypatch.setattr(run_agent, "WAITING_REPORT_INTERVAL_S", 0.3)
    event = AgentEnvelope(entity_key=b"acct-9", event_time_ms=1_000, external_event=b"order-9")
    errors = Collector.new()

    def build(pipeline: beam.Pipeline) -> None:
        events = pipeline | ReadEnvelopes(
            effector.address, events=[event], stop_when_idle_s=0.5, poll_wait_ms=50
        )
        config = AgentConfig(result_grace_ms=2_000)
        outputs = events | RunAgent(records_and_waits_without_timeout, config)
        outputs.intents | SubmitIntents(f"127.0.0.1:{free_port()}", max_attempts=1)
        outputs.errors | "Errors" >> errors.sink()

    with caplog.at_level(logging.INFO, logger="beam_agents.progress"):
        run_pipeline(build)
    waiting = [line for line in caplog.messages if line.startswith("RunAgent: ")]
    assert waiting, "the pipeline waited out a deadline without a word"
    assert re.fullmatch(
        r"RunAgent: 1 suspended run\(s\) wait for a result or their deadline; the next "
        r"deadline is in [0-2] s",
        waiting[0],
    )
    [dropped] = errors.values()
    assert dropped.reason == "suspension_dropped" and dropped.entity_key == b"acct-9"
    assert "1 intents pending" in dropped.detail


def test_a_pipeline_reading_the_effector_counts_as_unbounded_and_a_created_one_as_bounded() -> None:
    pipeline = beam.Pipeline()
    assert not _bounded(pipeline | ReadEnvelopes("127.0.0.1:1") | beam.Map(lambda pair: pair))
    assert _bounded(pipeline | beam.Create([1]))
