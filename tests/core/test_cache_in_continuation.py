"""The replay cache lives in the continuation (schema version 2); runs suspended before move it.

The golden bytes were written by the release before this layout, which kept the cache in a cell
of its own: ``plans_again_on_resume`` and ``fan_out`` run to their first suspension on ``acct-7``.
``process`` no longer binds that cell; an answer to such a run waits in the buffer for the
deadline timer, set for now, whose callback binds it, moves the cache and resumes the run.
"""

from __future__ import annotations

from typing import Any

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.pvalue import TaggedOutput
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.utils.timestamp import Timestamp

from beam_agents import AgentConfig, Complete, Suspend
from beam_agents._protos import (
    AgentEnvelope,
    Continuation,
    ModelCache,
    ToolResult,
    TraceEvent,
)
from beam_agents.core import dofn as dofn_module
from beam_agents.core.agent import intent_id_for
from beam_agents.core.clocks import epoch_clock
from beam_agents.core.context import ActivationContext
from beam_agents.core.dofn import AgentDoFn
from beam_agents.core.errors import ErrorReason, StateSchemaError
from beam_agents.core.state import decode_versioned
from beam_agents.model.fake import FakeLLM
from beam_agents.testing import EnvelopeStream
from tests.core.harness import (
    InMemoryKeyState,
    SharedProvider,
    ask,
    calls_containing,
    fan_out,
    main_outputs,
    make_fake,
)

K = b"acct-7"
ORDER = AgentEnvelope(entity_key=K, event_time_ms=1_000, external_event=b"order")
OLD_HEADER = bytes.fromhex("0801100118e8072801")
OLD_CONTINUATION = bytes.fromhex(
    "0801180222087368697070696e67322462303633656533322d633462362d353466342d613033312d66366562"
    "34326339663262655220306665353461666333643434353261353938316662333534343866653262366560e8"
    "0768057201018001048a01240801122014f387d2f608ca644451c0847fd19832dff09dada4c1b642b38b138a"
    "de6388828a0124080212206566c585fd13e1fc9b45b6f8a052dbeb357a279f39e78d867d23c37ce26bf2df"
)
OLD_CACHE = bytes.fromhex(
    "080112520a406232316233656133333936633339323937353265303131323561366131636431643437613134"
    "38373934376262336661633235363962356337343137303537362207736869702069742803300238e807"
)
OLD_FAN_OUT = bytes.fromhex(
    "08011803220766616e2d6f7574322430313061626133632d386634652d353939382d383033312d3362323863"
    "31623233356562322462303633656533322d633462362d353466342d613033312d6636656234326339663262"
    "65322434343164373662352d313865642d356565312d616437632d6637653836343233316635645220306665"
    "353461666333643434353261353938316662333534343866653262366560e80772030101018001058a012408"
    "0212202e5b14e516e54932bf3c2cfd774258dfc1e83898b255ba658e4218914ee57b5b8a012408021220f5bd"
    "66678b122c8746085d61ac9e23a531a00689c464c3f64305e180c30131138a012408021220063fc2f6a34234"
    "82fe0f664b5f43ae6299ba2a8bce7ec8c0d49f05a4a86651dc"
)
NEW_CONTINUATION = bytes.fromhex(
    "0802180222087368697070696e67322462303633656533322d633462362d353466342d613033312d66366562"
    "34326339663262655220306665353461666333643434353261353938316662333534343866653262366560e8"
    "0768057201018001048a01240801122014f387d2f608ca644451c0847fd19832dff09dada4c1b642b38b138a"
    "de6388828a0124080212206566c585fd13e1fc9b45b6f8a052dbeb357a279f39e78d867d23c37ce26bf2df"
    "a20156"  # field 20 (replay_cache), 86 bytes: the old cell's blob, unchanged
    "080112520a406232316233656133333936633339323937353265303131323561366131636431643437613134"
    "38373934376262336661633235363962356337343137303537362207736869702069742803300238e807"
)
"""What this layout writes for the same suspension: version 2, the cache as its last field."""


async def plans_again_on_resume(ctx: ActivationContext) -> Complete | Suspend:
    """Re-walks its run on resume: the plan then comes from the replay cache."""
    plan = await ctx.call_model(ask("plan the order"))
    ctx.act("ship", {"plan": plan.text})
    if not ctx.is_resume:
        return Suspend(snapshot=b"shipping")
    result = ctx.resume_result
    assert result is not None
    summary = await ctx.call_model(ask("summarize " + result.payload.decode()))
    ctx.act("notify", {"summary": summary.text})
    return Complete(output=summary.response)


async def plans_again_then_waits(ctx: ActivationContext) -> Complete | Suspend:
    """The same first activation; then it also waits for its notification to be sent."""
    plan = await ctx.call_model(ask("plan the order"))
    ctx.act("ship", {"plan": plan.text})
    if not ctx.is_resume:
        return Suspend(snapshot=b"shipping")
    summary = await ctx.call_model(ask("summarize the shipment"))
    ctx.act("notify", {"summary": summary.text})
    if ctx.snapshot == b"notified":
        return Complete(output=b"done")
    return Suspend(snapshot=b"notified")


def started(agent: Any, fake: FakeLLM | None, **config: Any) -> AgentDoFn:
    if fake is not None:
        config["provider_factory"] = lambda: fake
    dofn = AgentDoFn(agent, AgentConfig(**config))
    dofn.setup()
    return dofn


def suspended_before() -> InMemoryKeyState:
    """A key as the release before left it, suspended on ``ship`` with one cached call."""
    cells = InMemoryKeyState()
    cells.header.value = OLD_HEADER
    cells.continuation.value = OLD_CONTINUATION
    cells.cache.value = OLD_CACHE
    return cells


def answer(step: int, payload: bytes, at_ms: int) -> AgentEnvelope:
    result = ToolResult(
        intent_id=intent_id_for(K, 0, step), entity_key=K, status=ToolResult.OK, payload=payload
    )
    return AgentEnvelope(entity_key=K, event_time_ms=at_ms, tool_result=result)


def fire_deadline(dofn: AgentDoFn, cells: InMemoryKeyState) -> list[Any]:
    at = cells.deadline.at
    assert isinstance(at, Timestamp)
    outputs: list[Any] = dofn._on_deadline(key=K, fired=at, **cells.params())
    return outputs


def tagged(outputs: list[Any], tag: str) -> list[Any]:
    return [out.value for out in outputs if isinstance(out, TaggedOutput) and out.tag == tag]


def test_a_run_that_called_the_model_suspends_as_version_2_with_its_cache_inside() -> None:
    fake = make_fake()
    dofn = started(plans_again_on_resume, fake)
    cells = InMemoryKeyState()
    try:
        cells.process(dofn, K, ORDER)
    finally:
        dofn.teardown()
    assert cells.continuation.value == NEW_CONTINUATION
    assert cells.header.value == OLD_HEADER and cells.cache.value is None
    # A release before this layout reads continuations up to version 1: it refuses this one
    # as newer state instead of resuming without the cache and calling the model again.
    with pytest.raises(StateSchemaError, match="schema version 2"):
        decode_versioned(Continuation, NEW_CONTINUATION, 1)


def test_a_run_that_never_called_the_model_writes_its_continuation_as_before() -> None:
    dofn = started(fan_out, None)
    cells = InMemoryKeyState()
    try:
        cells.process(dofn, K, ORDER)
        assert cells.continuation.value == OLD_FAN_OUT  # version 1: every release reads it
        # Nothing to move: its answers resume the run at once, in ``process``.
        outputs = [cells.process(dofn, K, answer(step, b"1", 2_000)) for step in (0, 1, 2)]
    finally:
        dofn.teardown()
    assert [len(main_outputs(out)) for out in outputs] == [0, 0, 1]
    assert cells.continuation.value is None and cells.deadline.at is None
    assert cells.buffer.values == [] and cells.cache.reads == 0


def test_an_answer_to_a_run_suspended_before_waits_for_the_timer_that_moves_its_cache() -> None:
    fake = make_fake()
    dofn = started(plans_again_on_resume, fake)
    cells = suspended_before()
    shipped = answer(1, b'"t-1"', 2_000)
    try:
        deferred = cells.process(dofn, K, shipped)
        # Nothing ran: the answer waits in the buffer and the deadline timer is set for now.
        assert deferred == [] and fake.requests == []
        assert cells.buffer.values == [shipped.SerializeToString()]
        assert isinstance(cells.deadline.at, Timestamp)
        assert cells.cache.reads == 0 and cells.continuation.value == OLD_CONTINUATION
        resumed = fire_deadline(dofn, cells)
    finally:
        dofn.teardown()
    # The re-walked plan came from the moved cache (no "plan" call); the run completed.
    assert main_outputs(resumed) == [b"shipped"]
    assert calls_containing(fake, "plan") == 0 and calls_containing(fake, "summarize") == 1
    assert [intent.tool_name for intent in tagged(resumed, "intents")] == ["notify"]
    assert tagged(resumed, "errors") == []
    assert cells.cache.value is None and cells.continuation.value is None
    assert cells.buffer.values == [] and cells.deadline.at is None


def test_the_same_run_on_this_layout_gives_the_same_outputs_without_waiting() -> None:
    fake = make_fake()
    dofn = started(plans_again_on_resume, fake)
    cells = InMemoryKeyState()
    try:
        cells.process(dofn, K, ORDER)
        resumed = cells.process(dofn, K, answer(1, b'"t-1"', 2_000))
    finally:
        dofn.teardown()
    assert main_outputs(resumed) == [b"shipped"]
    assert [intent.tool_name for intent in tagged(resumed, "intents")] == ["notify"]
    assert calls_containing(fake, "plan") == 1  # the first activation's; the resume replayed it


def test_a_moved_run_that_suspends_again_keeps_both_calls_in_its_continuation() -> None:
    fake = make_fake()
    dofn = started(plans_again_then_waits, fake)
    cells = suspended_before()
    event = AgentEnvelope(entity_key=K, event_time_ms=1_500, external_event=b"later")
    try:
        cells.process(dofn, K, event)  # an event waits for the run, as ever, and reads no cache
        assert cells.cache.reads == 0 and cells.deadline.at is None
        cells.process(dofn, K, answer(1, b'"t-1"', 2_000))
        fire_deadline(dofn, cells)
        assert cells.cache.value is None
        moved = Continuation.FromString(cells.continuation.value or b"")
        assert moved.schema_version == 2
        cache = ModelCache.FromString(moved.replay_cache)
        assert [(entry.seq, entry.step_index) for entry in cache.entries] == [(0, 0), (0, 2)]
        # The event still waits; the next answer resumes at once, in ``process``.
        assert cells.buffer.values == [event.SerializeToString()]
        done = cells.process(dofn, K, answer(3, b"{}", 3_000))
    finally:
        dofn.teardown()
    assert main_outputs(done)[0] == b"done"
    assert calls_containing(fake, "plan") == 1  # only the buffered event's new run called it
    assert calls_containing(fake, "summarize") == 1


def test_a_deferred_answer_of_a_key_wiped_by_its_ttl_is_refused_loudly() -> None:
    fake = make_fake()
    dofn = started(plans_again_on_resume, fake, ttl_ms=60_000)
    cells = suspended_before()
    shipped = answer(1, b'"t-1"', 2_000)
    later = AgentEnvelope(entity_key=K, event_time_ms=2_100, external_event=b"later")
    try:
        cells.process(dofn, K, shipped)
        cells.process(dofn, K, later)
        fired = Timestamp(micros=(2_100 + 60_000) * 1000)
        outputs = dofn._on_idle(key=K, fired=fired, **cells.params())
    finally:
        dofn.teardown()
    errors = tagged(outputs, "errors")
    assert sorted(error.reason for error in errors) == ["orphaned_result", "suspension_wiped"]
    orphaned = next(error for error in errors if error.reason == "orphaned_result")
    assert orphaned.envelope == shipped.SerializeToString()  # nothing is lost
    # Refused as the wiped run's, before the waiting event starts a run of its own.
    assert "no suspended run" in orphaned.detail
    assert calls_containing(fake, "plan") == 1 and cells.buffer.values == []
    assert cells.cache.value is None
    assert Continuation.FromString(cells.continuation.value or b"").seq == 1


def test_a_continuation_from_before_step_records_counts_as_one_that_called_the_model() -> None:
    continuation = Continuation.FromString(OLD_FAN_OUT)
    del continuation.steps[:]  # written before runs recorded their steps: nothing rules it out
    cells = InMemoryKeyState()
    cells.header.value = OLD_HEADER
    cells.continuation.value = continuation.SerializeToString(deterministic=True)
    dofn = started(fan_out, None)
    try:
        assert cells.process(dofn, K, answer(0, b"1", 2_000)) == []  # deferred
        fire_deadline(dofn, cells)
    finally:
        dofn.teardown()
    moved = Continuation.FromString(cells.continuation.value or b"")
    assert moved.schema_version == 2 and len(moved.pending_intent_ids) == 2
    assert cells.buffer.values == []


def test_a_record_keeps_the_continuation_as_the_release_before_recorded_it() -> None:
    dofn = started(plans_again_on_resume, make_fake(), record=True)
    cells = InMemoryKeyState()
    try:
        cells.process(dofn, K, ORDER)
        suspended = Continuation.FromString(cells.continuation.value or b"")
        resumed = cells.process(dofn, K, answer(1, b'"t-1"', 2_000))
    finally:
        dofn.teardown()
    [record] = tagged(resumed, "records")
    # Without the cache (the run's earlier records hold its calls), as version 1.
    assert record.continuation_before.SerializeToString(deterministic=True) == OLD_CONTINUATION
    assert suspended.replay_cache == OLD_CACHE


async def fails_on_resume(ctx: ActivationContext) -> Complete | Suspend:
    """The same first activation; its resume fails."""
    plan = await ctx.call_model(ask("plan the order"))
    ctx.act("ship", {"plan": plan.text})
    if not ctx.is_resume:
        return Suspend(snapshot=b"shipping")
    raise RuntimeError("the summary service is down")


def suspended_before_until(deadline_ms: int) -> InMemoryKeyState:
    """``suspended_before()`` with a deadline, as that release wrote one."""
    cells = suspended_before()
    continuation = Continuation.FromString(OLD_CONTINUATION)
    continuation.deadline_ms = deadline_ms
    cells.continuation.value = continuation.SerializeToString(deterministic=True)
    return cells


def test_an_answer_in_time_resumes_even_when_the_timer_fires_past_the_deadline() -> None:
    now_s = [109.0]
    fake = make_fake()
    dofn = started(plans_again_on_resume, fake, processing_clock=lambda: now_s[0])
    cells = suspended_before_until(110_000)
    try:
        assert cells.process(dofn, K, answer(1, b'"t-1"', 2_000)) == []
        now_s[0] = 110.5  # the runner was slow to fire the timer
        resumed = fire_deadline(dofn, cells)
    finally:
        dofn.teardown()
    assert main_outputs(resumed) == [b"shipped"] and tagged(resumed, "errors") == []


def test_an_answer_past_the_deadline_is_refused_when_it_arrives_not_deferred() -> None:
    dofn = started(plans_again_on_resume, make_fake(), processing_clock=lambda: 111.0)
    cells = suspended_before_until(110_000)
    try:
        late = answer(1, b'"t-1"', 2_000)
        outputs = cells.process(dofn, K, late)
        stranger = cells.process(dofn, K, answer(7, b"{}", 2_000))  # not pending at all
    finally:
        dofn.teardown()
    refused = tagged(outputs, "errors") + tagged(stranger, "errors")
    assert [error.reason for error in refused] == [ErrorReason.ORPHANED_RESULT.value] * 2
    assert "after the deadline" in refused[0].detail
    assert cells.buffer.values == [] and cells.deadline.at is None


def test_a_deferred_answer_whose_resume_fails_leaves_the_run_its_own_deadline() -> None:
    dofn = started(fails_on_resume, make_fake(), processing_clock=lambda: 100.0)
    cells = suspended_before_until(110_000)
    try:
        cells.process(dofn, K, answer(1, b'"t-1"', 2_000))
        assert cells.deadline.at == Timestamp(micros=100_000 * 1000)  # now, to move the cache
        failed = fire_deadline(dofn, cells)
    finally:
        dofn.teardown()
    assert [error.reason for error in tagged(failed, "errors")] == ["activation_error"]
    assert cells.deadline.at == Timestamp(micros=110_000 * 1000)  # the run's own again
    moved = Continuation.FromString(cells.continuation.value or b"")
    assert moved.schema_version == 2 and moved.replay_cache == OLD_CACHE
    assert list(moved.pending_intent_ids) == [intent_id_for(K, 0, 1)]
    assert cells.cache.value is None and cells.buffer.values == []


async def plans_two_lookups(ctx: ActivationContext) -> Complete | Suspend:
    """Plans, asks two lookups, and completes with their answers in the order they came."""
    await ctx.call_model(ask("plan the order"))
    ctx.act("lookup", {"region": "eu"})
    ctx.act("lookup", {"region": "us"})
    if not ctx.is_resume or ctx.pending_intent_ids:
        return Suspend(snapshot=b"looking")
    return Complete(output=b",".join(result.payload for result in ctx.results.values()))


def written_before(blob: bytes) -> tuple[bytes, bytes]:
    """A continuation and its cache as the release before wrote them, from this layout's."""
    continuation = Continuation.FromString(blob)
    cache = continuation.replay_cache
    continuation.ClearField("replay_cache")
    continuation.schema_version = 1
    return continuation.SerializeToString(deterministic=True), cache


def as_before(cells: InMemoryKeyState) -> None:
    """Rewrite a suspension as the release before wrote it."""
    cells.continuation.value, cells.cache.value = written_before(cells.continuation.value or b"")


def test_deferred_answers_resume_in_arrival_order_and_waiting_events_run_after() -> None:
    fake = make_fake()
    dofn = started(plans_two_lookups, fake, max_buffered_events=1)
    cells = InMemoryKeyState()
    later = AgentEnvelope(entity_key=K, event_time_ms=2_500, external_event=b"later")
    try:
        cells.process(
            dofn, K, AgentEnvelope(entity_key=K, event_time_ms=1_000, external_event=b"o")
        )
        as_before(cells)
        assert cells.process(dofn, K, answer(2, b"us", 2_000)) == []
        # The limit counts waiting events only: the deferred answer takes no place.
        assert tagged(cells.process(dofn, K, later), "errors") == []
        assert cells.process(dofn, K, answer(1, b"eu", 3_000)) == []
        resumed = fire_deadline(dofn, cells)
    finally:
        dofn.teardown()
    assert main_outputs(resumed) == [b"us,eu"]
    assert tagged(resumed, "errors") == []
    assert calls_containing(fake, "plan") == 2  # the first run's, and the waiting event's run
    assert cells.buffer.values == [] and cells.cache.value is None
    started_again = Continuation.FromString(cells.continuation.value or b"")
    assert started_again.seq == 1 and started_again.schema_version == 2


# -- in a pipeline: Beam's state, the timer firing on the runner -----------------------------


class _EarlierRelease(AgentDoFn):
    """Suspends as the release before did (version 1, the cache in its own cell); answers go
    through this release's ``process``, which does not read that cell."""

    def process(  # type: ignore[override]
        self,
        element: tuple[bytes, AgentEnvelope],
        header: Any = dofn_module._HEADER_STATE,
        memory: Any = dofn_module._MEMORY_STATE,
        cache: Any = dofn_module._CACHE_STATE,
        continuation: Any = dofn_module._CONTINUATION_STATE,
        buffer: Any = dofn_module._BUFFER_STATE,
        deadline: Any = dofn_module._DEADLINE_TIMER,
        idle: Any = dofn_module._IDLE_TIMER,
    ) -> list[Any]:
        outputs = super().process(element, header, memory, continuation, buffer, deadline, idle)
        if element[1].HasField("external_event"):
            earlier, earlier_cache = written_before(continuation.read())
            continuation.write(earlier)
            cache.write(earlier_cache)
        return outputs


def _source(pipeline: beam.Pipeline, runner: str) -> Any:
    shipped = answer(1, b'"t-1"', 2_000)
    if runner == "FnApiRunner":  # the default runner's: timers tick at each bundle's end
        return pipeline | beam.Create([(K, ORDER), (K, shipped)])
    stream = EnvelopeStream().envelope(ORDER).envelope(shipped)
    # A TestStream's clock is the epoch's and moves only when told to.
    return pipeline | stream.advance_processing_time(1_000).build()


@pytest.mark.parametrize("runner", ["FnApiRunner", "BundleBasedDirectRunner"])
def test_a_run_suspended_before_resumes_in_a_pipeline_from_its_moved_cache(runner: str) -> None:
    provider = SharedProvider(make_fake())
    ticks = runner == "FnApiRunner"
    config = AgentConfig(provider_factory=provider, processing_clock=None if ticks else epoch_clock)
    options = PipelineOptions(streaming=not ticks)
    chosen = FnApiRunner() if ticks else BundleBasedDirectRunner()
    with beam.Pipeline(runner=chosen, options=options) as pipeline:
        outputs = _source(pipeline, runner) | beam.ParDo(
            _EarlierRelease(plans_again_on_resume, config, ticks=ticks)
        ).with_outputs(
            dofn_module.INTENTS_TAG,
            dofn_module.TRACES_TAG,
            dofn_module.ERRORS_TAG,
            dofn_module.RECORDS_TAG,
            main="output",
        )
        assert_that(outputs.output, equal_to([b"shipped"]), label="output")
        assert_that(outputs[dofn_module.ERRORS_TAG], equal_to([]), label="errors")
        tools = outputs[dofn_module.INTENTS_TAG] | beam.Map(lambda intent: intent.tool_name)
        assert_that(tools, equal_to(["ship", "notify"]), label="intents")
        calls = outputs[dofn_module.TRACES_TAG] | beam.FlatMap(_model_calls)
        # The first run's plan; on resume, the re-walked plan from the moved cache, a summary.
        assert_that(calls, equal_to([(0, "false"), (0, "true"), (2, "false")]), label="calls")
    fake = provider.fake
    assert calls_containing(fake, "plan") == 1 and calls_containing(fake, "summarize") == 1


def _model_calls(event: TraceEvent) -> list[tuple[int, str]]:
    """``(step, cache hit)`` of an ``LLM_CALL`` trace event."""
    if event.event_type != TraceEvent.LLM_CALL:
        return []
    return [(event.step_index, event.attributes["beam_agents.cache_hit"])]
