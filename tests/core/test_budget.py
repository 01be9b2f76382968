"""The token budget of a run spans its resumes; replayed calls spend nothing."""

from __future__ import annotations

from beam_agents import AgentConfig, Complete, Suspend, intent_id_for
from beam_agents._protos import AgentEnvelope, TraceEvent
from beam_agents.core.agent import BudgetExceededError
from beam_agents.core.context import ActivationContext
from beam_agents.model.client import LlmRequest, TokenUsage
from beam_agents.model.fake import FakeLLM, match_contains, respond_with
from beam_agents.testing import EnvelopeStream
from tests.core.harness import Outputs, SharedProvider, run_agent, streamed

K = b"budget-1"
PLAN_USAGE = TokenUsage(input_tokens=15, output_tokens=5)  # 20 tokens
SUMMARY_USAGE = TokenUsage(input_tokens=10, output_tokens=5)  # 15 tokens


def ask(text: str) -> LlmRequest:
    return LlmRequest(model_id="planner", messages=[{"role": "user", "content": text}])


def make_provider() -> SharedProvider:
    return SharedProvider(
        FakeLLM(
            [
                (match_contains("plan"), respond_with(b"ship it", usage=PLAN_USAGE)),
                (match_contains("summarize"), respond_with(b"shipped", usage=SUMMARY_USAGE)),
            ]
        )
    )


async def continuing(ctx: ActivationContext) -> Complete | Suspend:
    """Plans and suspends; on resume makes one new call (no re-walk)."""
    if not ctx.is_resume:
        await ctx.call_model(ask("plan"))
        ctx.act("ship", {})
        return Suspend()
    summary = await ctx.call_model(ask("summarize"))
    return Complete(output=summary.response)


async def re_walking(ctx: ActivationContext) -> Complete | Suspend:
    """Plans and suspends; on resume re-walks the plan (replayed) and then summarizes."""
    await ctx.call_model(ask("plan"))
    ctx.act("ship", {})
    if not ctx.is_resume:
        return Suspend()
    summary = await ctx.call_model(ask("summarize"))
    return Complete(output=summary.response)


async def swallowing(ctx: ActivationContext) -> Complete | Suspend:
    """Tries to carry on past the budget by catching the error."""
    try:
        return await continuing(ctx)
    except BudgetExceededError:
        return Complete(output=b"carried on")


def run(agent: object, budget: int | None) -> tuple[Outputs, SharedProvider]:
    provider = make_provider()
    stream = (
        EnvelopeStream()
        .event(K, b"order", at_ms=1_000)
        .result(K, intent_id_for(K, 0, 1), at_ms=2_000)
    )
    outputs = run_agent(
        streamed(stream),
        agent,  # type: ignore[arg-type]
        AgentConfig(provider_factory=provider, max_tokens_per_run=budget),
        streaming=True,
    )
    return outputs, provider


def test_a_resume_that_takes_the_run_past_its_budget_is_refused() -> None:
    # 20 tokens before the suspension, 15 after: each activation alone fits in 30, the run not.
    outputs, provider = run(continuing, 30)
    assert outputs.output == []
    [error] = outputs.errors
    assert error.reason == "budget_exceeded"
    assert "35 tokens used of its max_tokens_per_run budget of 30" in error.detail
    assert AgentEnvelope.FromString(error.envelope).tool_result.intent_id == intent_id_for(K, 0, 1)
    assert provider.fake.call_count == 2  # the usage is only known after the call
    failure = [e for e in outputs.traces_for(K) if e.event_type == TraceEvent.ERROR]
    assert [e.attributes["reason"] for e in failure] == ["budget_exceeded"]


def test_the_same_run_completes_within_a_larger_budget() -> None:
    outputs, _ = run(continuing, 35)
    assert outputs.errors == [] and outputs.output == [b"shipped"]


def test_replayed_calls_are_not_charged_again() -> None:
    # 20 + 15 fits in 35 only if the replayed plan (another 20) is not counted.
    outputs, provider = run(re_walking, 35)
    assert outputs.errors == [] and outputs.output == [b"shipped"]
    assert provider.fake.call_count == 2


def test_a_run_that_used_its_whole_budget_is_refused_before_calling() -> None:
    outputs, provider = run(continuing, 20)
    [error] = outputs.errors
    assert error.reason == "budget_exceeded" and "was refused a model call" in error.detail
    assert provider.fake.call_count == 1


def test_catching_the_budget_error_does_not_let_the_activation_commit() -> None:
    outputs, _ = run(swallowing, 30)
    assert outputs.output == []
    assert [error.reason for error in outputs.errors] == ["budget_exceeded"]
