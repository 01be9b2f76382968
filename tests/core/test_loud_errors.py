# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated.)
"""Rule family: failures are loud. Every ``.errors`` record is logged, with a traceback.

An exception that fails an activation leaves its trimmed traceback on the ``.errors`` record,
and the record's detail names the agent's file and line. The ``DoFn`` logs every record at
WARNING whether or not anyone consumes ``.errors``, at most ``LOG_LIMIT`` lines per interval
and then one line counting the rest.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.runners.portability.fn_api_runner.fn_runner import FnApiRunner

from beam_agents import AgentConfig, Complete, RunAgent
from beam_agents._protos import AgentEnvelope, AgentError, Continuation, ToolResult
from beam_agents.core import observability
from beam_agents.core.activation import RouteFailure, choose_route, deadline_outcome
from beam_agents.core.context import ActivationContext, AgentFn
from beam_agents.core.observability import ErrorLog, explain, log_line
from beam_agents.hitl import Deny, FallbackContext, HitlPolicy
from beam_agents.io.run_agent import AgentDoFn
from tests.core.harness import InMemoryKeyState, created, event, main_outputs, run_agent, tally

THIS_FILE = Path(__file__).name
SOURCE = Path(__file__).read_text().splitlines()


def line_of(marker: str) -> int:
    """The line number of the one source line of this file that ends with ``marker``."""
    [number] = [i + 1 for i, line in enumerate(SOURCE) if line.endswith(marker)]
    return number


# -- agents -----------------------------------------------------------------------------------


async def triage(ctx: ActivationContext) -> Complete:
    routes = {"known": b"ok"}
    return Complete(output=routes[ctx.event.decode()])  # raises: missing route


def lookup(table: dict[str, bytes], name: str) -> bytes:
    return table[name]  # raises: in a helper


async def calls_a_helper(ctx: ActivationContext) -> Complete:
    return Complete(output=lookup({}, "missing"))  # calls the helper


async def parses_json(ctx: ActivationContext) -> Complete:
    parsed = json.loads(ctx.event)  # raises: inside the standard library
    return Complete(output=str(parsed).encode())


async def misuses_memory(ctx: ActivationContext) -> Complete:
    ctx.memory.set("note", "not bytes")  # type: ignore[arg-type]  # raises: in the runtime
    return Complete(output=b"")


async def fails_with_a_cause(ctx: ActivationContext) -> Complete:
    try:
        int(ctx.event)
    except ValueError as exc:
        raise RuntimeError("could not read the amount") from exc  # raises: with a cause
    return Complete(output=b"")


def broken_route(_: FallbackContext) -> Deny:
    raise RuntimeError("route bug")  # raises: in the route


def unconsumed_errors_pipeline(agent: AgentFn, elements: list[tuple[bytes, AgentEnvelope]]) -> None:
    """Run ``agent`` and consume only ``.output``: nobody reads ``.errors``."""
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        outputs = (
            pipeline
            | beam.Create(elements).with_output_types(tuple[bytes, AgentEnvelope])
            | RunAgent(agent, config=AgentConfig())
        )
        _ = outputs.output | beam.Map(lambda output: output)


def logged(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        record
        for record in caplog.records
        if record.name.startswith("beam_agents.core") and record.levelno >= logging.INFO
    ]


# -- the log line -----------------------------------------------------------------------------


def test_an_agent_that_raises_is_logged_even_when_nobody_reads_errors(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="beam_agents.core")
    unconsumed_errors_pipeline(triage, [event(b"acct-7", b"missing")])
    [record] = logged(caplog)
    message = record.getMessage()
    where = f"{THIS_FILE}:{line_of('# raises: missing route')} in triage"
    assert "b'acct-7'" in message and "activation_error" in message
    assert f"KeyError: 'missing' (at {where})" in message
    # The end of the traceback comes with it: the agent's frame and its source line.
    assert f"line {line_of('# raises: missing route')}, in triage" in message
    assert "routes[ctx.event.decode()]" in message


def test_records_that_are_not_exceptions_are_logged_without_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="beam_agents.core")
    stray = AgentEnvelope(
        entity_key=b"acct-8",
        event_time_ms=1_000,
        tool_result=ToolResult(intent_id="nobody-asked", status=ToolResult.OK),
    )
    outputs = run_agent(created([(b"acct-8", stray), ("not", "a pair")], typed=False), tally)
    assert outputs.reasons() == ["malformed_element", "orphaned_result"]
    assert all(error.traceback == "" for error in outputs.errors)
    messages = sorted(record.getMessage() for record in logged(caplog))
    assert len(messages) == 2
    malformed, orphaned = messages
    assert "malformed_element" in malformed
    assert "orphaned_result for key b'acct-8'" in orphaned and "no suspended run" in orphaned
    assert not any("File " in message or "\n" in message for message in messages)
    levels = {record.getMessage().split(" ")[2]: record.levelname for record in logged(caplog)}
    assert levels == {"malformed_element": "WARNING", "orphaned_result": "INFO"}


def test_the_log_line_shows_only_the_last_frames_of_the_traceback() -> None:
    frames = "".join(f'  File "m.py", line {n}, in f{n}\n    call()\n' for n in range(1, 8))
    error = AgentError(
        entity_key=b"k",
        reason="activation_error",
        detail="ValueError: x",
        traceback=f"Traceback (most recent call last):\n{frames}ValueError: x\n",
    )
    line = log_line(error)
    assert line.startswith(".errors record activation_error for key b'k' (seq 0): ValueError: x")
    shown = re.findall(r"in (f\d)", line)
    assert shown == ["f5", "f6", "f7"]
    assert line.endswith("\nValueError: x")


# -- rate limiting ----------------------------------------------------------------------------


def test_many_errors_log_a_bounded_number_of_lines_and_count_the_rest(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="beam_agents.core")
    keys = [f"acct-{n:02}".encode() for n in range(25)]
    unconsumed_errors_pipeline(triage, [event(key, b"missing") for key in keys])
    messages = [record.getMessage() for record in logged(caplog)]
    per_record = [message for message in messages if message.startswith(".errors record")]
    summaries = [message for message in messages if "were not logged" in message]
    assert len(per_record) == observability.LOG_LIMIT
    assert len(summaries) == 1
    assert summaries[0].startswith(f"{25 - observability.LOG_LIMIT} more .errors records")


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def record(n: int) -> AgentError:
    return AgentError(entity_key=f"k{n}".encode(), reason="activation_error", detail="boom")


def test_the_limit_applies_per_interval_and_the_summary_comes_when_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="beam_agents.core")
    clock = FakeClock()
    errors = ErrorLog(limit=3, interval_s=10.0, clock=clock)
    errors.report([record(n) for n in range(5)])
    errors.flush()  # the interval is not over: nothing to say yet
    assert len(logged(caplog)) == 3 and errors.suppressed == 2
    clock.now += 10.0
    errors.report([record(5)])  # a new interval: first the summary, then the record
    messages = [r.getMessage() for r in logged(caplog)]
    assert messages[3].startswith("2 more .errors records were not logged")
    assert "for key b'k5'" in messages[4] and errors.suppressed == 0
    errors.report([record(n) for n in range(6, 9)])
    clock.now += 10.0
    errors.flush()  # the end of a bundle after the interval
    assert logged(caplog)[-1].getMessage().startswith("1 more .errors records")
    errors.report([record(9)])
    errors.flush(final=True)  # teardown: nothing was suppressed, nothing to summarize
    assert len(logged(caplog)) == 9
    assert "for key b'k9'" in logged(caplog)[-1].getMessage()


class CountingLog:
    """Stands in for the ``DoFn``'s ``ErrorLog`` and counts the reports it is given."""

    def __init__(self) -> None:
        self.log = ErrorLog()
        self.reports = 0

    @property
    def suppressed(self) -> int:
        return self.log.suppressed

    def report(self, errors: Iterable[AgentError]) -> None:
        self.reports += 1
        self.log.report(errors)

    def flush(self, *, final: bool = False) -> None:
        self.log.flush(final=final)


def test_only_a_call_with_errors_reaches_the_error_log() -> None:
    dofn = AgentDoFn(triage, AgentConfig())
    dofn.setup()
    counting = CountingLog()
    dofn._error_log = counting  # type: ignore[assignment]
    try:
        cells = InMemoryKeyState()
        fine = AgentEnvelope(entity_key=b"k", event_time_ms=1, external_event=b"known")
        assert main_outputs(cells.process(dofn, b"k", fine)) == [b"ok"]
        assert counting.reports == 0
        failing = AgentEnvelope(entity_key=b"k", event_time_ms=2, external_event=b"missing")
        cells.process(dofn, b"k", failing)
        assert counting.reports == 1
    finally:
        dofn.teardown()


# -- the traceback on the record --------------------------------------------------------------


def test_the_errors_record_carries_the_agents_traceback() -> None:
    outputs = run_agent(created([event(b"acct-7", b"missing")]), triage)
    [error] = outputs.errors
    raising = line_of("# raises: missing route")
    assert error.reason == "activation_error"
    assert error.detail == f"KeyError: 'missing' (at {THIS_FILE}:{raising} in triage)"
    assert error.traceback.startswith("Traceback (most recent call last):\n")
    assert f'{THIS_FILE}", line {raising}, in triage\n' in error.traceback
    assert "return Complete(output=routes[ctx.event.decode()])" in error.traceback
    assert error.traceback.endswith("KeyError: 'missing'\n")
    # The runtime's frames (activation, coroutine driver, asyncio) are trimmed away.
    assert error.traceback.count('  File "') == 1


def test_the_detail_names_the_innermost_frame_of_the_agents_code() -> None:
    outputs = run_agent(created([event(b"a", b"x")]), calls_a_helper)
    [error] = outputs.errors
    helper = line_of("# raises: in a helper")
    assert error.detail == f"KeyError: 'missing' (at {THIS_FILE}:{helper} in lookup)"
    frames = re.findall(r"line (\d+), in (\w+)", error.traceback)
    assert frames == [
        (str(line_of("# calls the helper")), "calls_a_helper"),
        (str(helper), "lookup"),
    ]


def test_a_failure_inside_a_library_is_placed_at_the_agents_call() -> None:
    outputs = run_agent(created([event(b"a", b"{not json")]), parses_json)
    [error] = outputs.errors
    at = f"(at {THIS_FILE}:{line_of('# raises: inside the standard library')} in parses_json)"
    assert error.detail.startswith("JSONDecodeError: ") and at in error.detail
    # Library frames stay in the traceback: they show how the call failed.
    assert "json/decoder.py" in error.traceback


def test_a_runtime_error_keeps_the_agents_frame_and_where_it_was_raised() -> None:
    outputs = run_agent(created([event(b"a", b"x")]), misuses_memory)
    [error] = outputs.errors
    at = f"(at {THIS_FILE}:{line_of('# raises: in the runtime')} in misuses_memory)"
    assert error.detail.startswith("MemorySlotError: ") and at in error.detail
    files = re.findall(r'  File "([^"]+)"', error.traceback)
    assert len(files) == 2
    assert files[0].endswith(THIS_FILE) and files[1].endswith("context.py")


def test_a_chained_cause_is_kept() -> None:
    outputs = run_agent(created([event(b"a", b"twelve")]), fails_with_a_cause)
    [error] = outputs.errors
    assert "ValueError: invalid literal for int()" in error.traceback
    assert "The above exception was the direct cause" in error.traceback
    assert error.traceback.endswith("RuntimeError: could not read the amount\n")


def test_a_failing_timeout_route_carries_its_traceback() -> None:
    policy = HitlPolicy(
        timeout_ms=5_000, intent_ttl_ms=60_000, approval_channel="ops", on_timeout=broken_route
    )
    run = Continuation(seq=2, next_step=3, deadline_ms=10_000, pending_intent_ids=["i"])
    route = choose_route(policy, b"k", run, 10_000)
    assert isinstance(route, RouteFailure)
    outcome = deadline_outcome(route, b"k", run, policy, fired_ms=10_000, now_ms=50)
    [error] = outcome.errors
    at = f"(at {THIS_FILE}:{line_of('# raises: in the route')} in broken_route)"
    assert error.reason == "timeout_route_error" and at in error.detail
    assert "in broken_route" in error.traceback
    assert error.traceback.endswith("RuntimeError: route bug\n")


# -- bounds -----------------------------------------------------------------------------------


def ping(depth: int) -> None:
    if depth == 0:
        raise ValueError("deep")  # raises: deep down
    pong(depth - 1)


def pong(depth: int) -> None:
    ping(depth - 1)


def test_a_deep_traceback_keeps_its_innermost_frames() -> None:
    try:
        ping(60)
    except ValueError as exc:
        detail, text = explain(exc, ping)
    frames = re.findall(r"line (\d+), in (\w+)", text)
    assert len(frames) == observability.MAX_FRAMES
    assert frames[-1] == (str(line_of("# raises: deep down")), "ping")
    assert text.endswith("ValueError: deep\n")
    assert detail == f"ValueError: deep (at {THIS_FILE}:{line_of('# raises: deep down')} in ping)"


def test_a_huge_traceback_is_cut_to_its_end() -> None:
    message = "x" * (3 * observability.MAX_CHARS)
    try:
        raise ValueError(message + "\nthe end")
    except ValueError as exc:
        _, text = explain(exc)
    assert len(text) <= observability.MAX_CHARS
    assert text.startswith("[") and "characters of the traceback dropped]\n" in text
    assert text.endswith("the end\n")
