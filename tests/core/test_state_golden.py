"""Golden bytes of the key-state formats: what a commit writes, and that it reads back.

State formats are version 1 until the first release; from then on a change to these bytes
needs a migration. The continuation carries its run's replay cache as its last field.
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
HEADER = bytes.fromhex("0801100118e8072801")
"""schema_version 1, next_seq 1, last_activity_ms 1000, suspended."""
CACHE = bytes.fromhex(
    "080112520a406232316233656133333936633339323937353265303131323561366131636431643437613134"
    "38373934376262336661633235363962356337343137303537362207736869702069742803300238e807"
)
"""The run's replay cache: one call (``plan the order``, answered ``ship it``)."""
CONTINUATION = (
    bytes.fromhex(
        "0801180222087368697070696e67322462303633656533322d633462362d353466342d613033312d66366562"
        "34326339663262655220306665353461666333643434353261353938316662333534343866653262366560e8"
        "0768057201018001048a01240801122014f387d2f608ca644451c0847fd19832dff09dada4c1b642b38b138a"
        "de6388828a0124080212206566c585fd13e1fc9b45b6f8a052dbeb357a279f39e78d867d23c37ce26bf2df"
        "a20156"  # field 20 (replay_cache), 86 bytes
    )
    + CACHE
    + bytes.fromhex(  # field 21 (submission_digests): the pending intent's digest
        "aa01480a2462303633656533322d633462362d353466342d613033312d6636656234326339663262651220"
        "3548d02a1d9492a3c62e30e35a5fcb897fdee97d5f5ed8863bcc3d3f01d62629"
    )
)
FAN_OUT = bytes.fromhex(
    "08011803220766616e2d6f7574322430313061626133632d386634652d353939382d383033312d3362323863"
    "31623233356562322462303633656533322d633462362d353466342d613033312d6636656234326339663262"
    "65322434343164373662352d313865642d356565312d616437632d6637653836343233316635645220306665"
    "353461666333643434353261353938316662333534343866653262366560e80772030101018001058a012408"
    "0212202e5b14e516e54932bf3c2cfd774258dfc1e83898b255ba658e4218914ee57b5b8a012408021220f5bd"
    "66678b122c8746085d61ac9e23a531a00689c464c3f64305e180c30131138a012408021220063fc2f6a34234"
    "82fe0f664b5f43ae6299ba2a8bce7ec8c0d49f05a4a86651dcaa01480a2430313061626133632d386634652d"
    "353939382d383033312d3362323863316232333565621220d88283a95890b05531c3aac2fece24f22162e444"
    "9fa2a803cf99eac202395d21aa01480a2434343164373662352d313865642d356565312d616437632d663765"
    "38363432333166356412207a345c75d0c7c13ce03633391714f5914b6c34a2fcf3a0f2b4bee09391519c27aa"
    "01480a2462303633656533322d633462362d353466342d613033312d66366562343263396632626512208d66"
    "0791f4da248556a1af6dbcb90b53300ec71bd29948793d78da46cd3e9d97"
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
    assert cells.header.value == HEADER
    assert cells.continuation.value == CONTINUATION
    assert Continuation.FromString(CONTINUATION).replay_cache == CACHE
    assert ModelCache.FromString(CACHE).schema_version == 1


def test_the_golden_state_resumes_from_its_cache_without_calling_the_model_again() -> None:
    fake = make_fake()
    dofn = started(plans_again_on_resume, fake)
    cells = InMemoryKeyState()
    cells.header.value, cells.continuation.value = HEADER, CONTINUATION
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
