"""Golden bytes of the key-state formats: what a commit writes, and that it reads back.

State formats are version 1 until the first release; from then on a change to these bytes
needs a migration. The header carries the suspended run's continuation, which carries its
replay cache.
"""

from __future__ import annotations

from typing import Any

from beam_agents import AgentConfig, Complete, Suspend
from beam_agents._protos import AgentEnvelope, Continuation, ModelCache, ToolResult
from beam_agents.core.agent import intent_id_for
from beam_agents.core.context import ActivationContext
from beam_agents.io.run_agent import AgentDoFn
from beam_agents.model.fake import FakeLLM
from tests.core.harness import (
    InMemoryKeyState,
    ask,
    calls_containing,
    fan_out,
    main_outputs,
    make_fake,
)

K = b"acct-7"
ORDER = AgentEnvelope(entity_key=K, event_time_ms=1_000, external_event=b"order")
HEADER = bytes.fromhex("0801100118e80722e402")
"""schema_version 1, next_seq 1, last_activity_ms 1000; then field 4, the 356-byte continuation."""
CACHE = bytes.fromhex(
    "080112630a513134663338376432663630386361363434343531633038343766643139383332646666303964"
    "61646134633162363432623338623133386164653633383838323a303a303a36313633363337343264333722"
    "07736869702069742803300238e807"
)
"""The run's replay cache: one call (``plan the order``, answered ``ship it``)."""
CONTINUATION = (
    bytes.fromhex(
        "0801180222087368697070696e67322462303633656533322d633462362d353466342d613033312d66366562"
        "34326339663262655220343063353361356239376239366461313861646266623636646430356565646160e8"
        "0768057201018001048a01240801122014f387d2f608ca644451c0847fd19832dff09dada4c1b642b38b138a"
        "de6388828a0124080212206566c585fd13e1fc9b45b6f8a052dbeb357a279f39e78d867d23c37ce26bf2dfa2"
        "0167"
        # field 20 (replay_cache), 103 bytes
    )
    + CACHE
    + bytes.fromhex(  # field 21 (submission_digests): the pending intent's digest
        "aa01480a2462303633656533322d633462362d353466342d613033312d66366562343263396632626512207b"
        "6bc5f5a6f0ea8d08b76dba594d92792b98e24ffb6870456697df9a5644a4d0"
    )
)
FAN_OUT = bytes.fromhex(
    "08011803220766616e2d6f7574322430313061626133632d386634652d353939382d383033312d3362323863"
    "31623233356562322462303633656533322d633462362d353466342d613033312d6636656234326339663262"
    "65322434343164373662352d313865642d356565312d616437632d6637653836343233316635645220343063"
    "353361356239376239366461313861646266623636646430356565646160e80772030101018001058a012408"
    "0212202e5b14e516e54932bf3c2cfd774258dfc1e83898b255ba658e4218914ee57b5b8a012408021220f5bd"
    "66678b122c8746085d61ac9e23a531a00689c464c3f64305e180c30131138a012408021220063fc2f6a34234"
    "82fe0f664b5f43ae6299ba2a8bce7ec8c0d49f05a4a86651dcaa01480a2430313061626133632d386634652d"
    "353939382d383033312d336232386331623233356562122095d9029c69e0f57d2558ab4b61ed88c5453a2c98"
    "d98a6defe10cc576a75feca0aa01480a2434343164373662352d313865642d356565312d616437632d663765"
    "383634323331663564122090362bf5899c688c5060991fd2d353d9798a82157ddada4ec41c876b8b958ba7aa"
    "01480a2462303633656533322d633462362d353466342d613033312d663665623432633966326265122035f8"
    "42b10e417f3d59f27e5793c589e5e76459b921080a5f01da923d9393c177"
)
"""A run that never called the model: three pending intents, no replay cache."""


async def plans_again_on_resume(ctx: ActivationContext) -> Complete | Suspend:
    """Re-walks its run on resume: the plan then comes from the replay cache."""
    plan = await ctx.call_model(ask("plan the order"))
    ctx.act("ship", {"plan": plan.text})
    if not ctx.is_resume:
        return Suspend(snapshot=b"shipping")
    result = ctx.resume_result
    assert result is not None
    summary = await ctx.call_model(ask("summarize " + result.payload.decode()))
    return Complete(output=summary.response)


def started(agent: Any, fake: FakeLLM | None) -> AgentDoFn:
    config: dict[str, Any] = {} if fake is None else {"provider_factory": lambda: fake}
    # Bounded, as a batch pipeline's: no implicit deadline, so no wall-clock time in the bytes.
    dofn = AgentDoFn(agent, AgentConfig(**config), bounded=True)
    dofn.setup()
    return dofn


def answer(step: int, payload: bytes, at_ms: int) -> AgentEnvelope:
    result = ToolResult(
        intent_id=intent_id_for(K, 0, step), entity_key=K, status=ToolResult.OK, payload=payload
    )
    return AgentEnvelope(entity_key=K, event_time_ms=at_ms, tool_result=result)


def test_a_suspension_writes_the_golden_header_and_continuation_with_its_cache() -> None:
    dofn = started(plans_again_on_resume, make_fake())
    cells = InMemoryKeyState()
    try:
        cells.process(dofn, K, ORDER)
    finally:
        dofn.teardown()
    assert cells.header.values == [HEADER + CONTINUATION]
    assert Continuation.FromString(CONTINUATION).replay_cache == CACHE
    assert ModelCache.FromString(CACHE).schema_version == 1


def test_the_golden_state_resumes_from_its_cache_without_calling_the_model_again() -> None:
    fake = make_fake()
    dofn = started(plans_again_on_resume, fake)
    cells = InMemoryKeyState()
    cells.header.values = [HEADER + CONTINUATION]
    try:
        outputs = cells.process(dofn, K, answer(1, b'"t-1"', 2_000))
    finally:
        dofn.teardown()
    assert len(main_outputs(outputs)) == 1
    assert calls_containing(fake, "plan") == 0 and calls_containing(fake, "summarize") == 1
    assert cells.continuation.value is None


def test_a_run_without_model_calls_writes_the_golden_continuation_and_resumes() -> None:
    dofn = started(fan_out, None)
    cells = InMemoryKeyState()
    try:
        cells.process(dofn, K, ORDER)
        assert cells.continuation.value == FAN_OUT
        outputs = [cells.process(dofn, K, answer(step, b"1", 2_000)) for step in (0, 1, 2)]
    finally:
        dofn.teardown()
    assert [len(main_outputs(out)) for out in outputs] == [0, 0, 1]
    assert cells.continuation.value is None


LATER = AgentEnvelope(entity_key=K, event_time_ms=2_000, external_event=b"later")
BUFFERED = bytes.fromhex("000a06616363742d3710d00f1a056c61746572")
"""A header-bag element buffering ``LATER``: a zero byte, then the envelope."""


def test_an_event_behind_the_suspension_is_appended_as_its_golden_element() -> None:
    dofn = started(plans_again_on_resume, make_fake())
    cells = InMemoryKeyState()
    try:
        cells.process(dofn, K, ORDER)
        cells.process(dofn, K, LATER)
    finally:
        dofn.teardown()
    assert cells.header.values == [HEADER + CONTINUATION, BUFFERED]
