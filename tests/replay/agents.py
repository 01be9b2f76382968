"""Agents, configs and events for the replay and backtest tests (named as ``module:function``).

``screen`` screens a payment: a read-only risk lookup, one model call, and for a flagged one a
``record`` intent (the effector tests' tool, which writes each execution to a ledger). With
``"wait": true`` in the event it suspends until the intent's result comes back. Its variants
change one thing each. ``PROVIDER`` is one ``FakeLLM`` shared by every config, so a test can
count the provider calls of a replay or backtest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random

from beam_agents import AgentConfig, canonical_json_bytes
from beam_agents._protos import AgentEnvelope, ToolResult
from beam_agents.core.agent import Complete, Suspend
from beam_agents.core.config import RecordOptions
from beam_agents.core.context import ActivationContext
from beam_agents.model.client import LlmRequest
from beam_agents.model.fake import FakeLLM, match_any, match_contains, respond_with
from beam_agents.tools import ToolRegistry, tool

MODEL_ID = "screen-1"
LARGE = 950
PROVIDER = FakeLLM(
    [
        (match_contains("risk=high"), respond_with(b"flag")),
        (match_any(), respond_with(b"ok")),
    ]
)


@tool
def risk(account: str) -> str:
    """The account's risk band.

    Args:
        account: the account.
    """
    return "high" if int(account.rsplit("-", 1)[1]) % 7 == 0 else "low"


def make_provider() -> FakeLLM:
    """The shared fake model."""
    return PROVIDER


def make_config() -> AgentConfig:
    """The config every test agent runs with, recording."""
    return AgentConfig(
        provider_factory=make_provider, tool_registry=ToolRegistry([risk]), record=True
    )


def make_config_in_namespace() -> AgentConfig:
    """The config with a production intent namespace."""
    return dataclasses.replace(make_config(), namespace="prod-v1")


def make_config_in_other_namespace() -> AgentConfig:
    """The config with a namespace other than the recording's."""
    return dataclasses.replace(make_config(), namespace="staging")


def make_config_small_values() -> AgentConfig:
    """The config recording memory slots over 8 bytes by digest only."""
    return dataclasses.replace(make_config(), record=RecordOptions(max_value_bytes=8))


def make_config_without_provider() -> AgentConfig:
    """A config without a model provider (a backtest must then not call the model)."""
    return AgentConfig(tool_registry=ToolRegistry([risk]), record=True)


def _prompt(payment: dict[str, object], band: str) -> str:
    return f"screen {payment['id']} amount={payment['amount']} risk={band}"


async def _screen(
    ctx: ActivationContext,
    *,
    prompt: str = "",
    act: bool = True,
    large: bool = False,
    remember: bool = True,
) -> Complete | Suspend:
    if ctx.is_resume:
        payment = json.loads(ctx.snapshot)
        result = ctx.resume_result
        done = result is not None and result.status == ToolResult.OK
        return Complete(_decision(payment, "flagged" if done else "unflagged"))
    payment = json.loads(ctx.event)
    if remember:
        ctx.memory.append("amounts", str(payment["amount"]).encode(), max_items=4)
    band = await ctx.run_tool("risk", {"account": payment["account"]})
    text = prompt.format(**payment, band=band) if prompt else _prompt(payment, band)
    reply = await ctx.call_model(LlmRequest(MODEL_ID, text))
    flagged = reply.text == "flag" or (large and int(payment["amount"]) >= LARGE)
    if not flagged:
        return Complete(_decision(payment, "ok"))
    if act:
        ctx.act("record", {"note": str(payment["id"])})
    if payment.get("wait") and act:
        return Suspend(snapshot=canonical_json_bytes(payment))
    return Complete(_decision(payment, "flagged"))


def _decision(payment: dict[str, object], decision: str) -> bytes:
    return canonical_json_bytes({"id": payment["id"], "decision": decision})


async def screen(ctx: ActivationContext) -> Complete | Suspend:
    """The recorded agent."""
    return await _screen(ctx)


async def screen_prompt_changed(ctx: ActivationContext) -> Complete | Suspend:
    """One prompt string changed."""
    return await _screen(ctx, prompt="screen {id} amt={amount} risk={band}")


async def screen_without_act(ctx: ActivationContext) -> Complete | Suspend:
    """The ``act`` removed."""
    return await _screen(ctx, act=False)


async def screen_large_too(ctx: ActivationContext) -> Complete | Suspend:
    """A changed decision rule: large payments are flagged too."""
    return await _screen(ctx, large=True)


async def screen_forgetful(ctx: ActivationContext) -> Complete | Suspend:
    """The memory write removed."""
    return await _screen(ctx, remember=False)


async def screen_asks_again(ctx: ActivationContext) -> Complete | Suspend:
    """One more model call, whose error the agent catches (the activation still commits)."""
    outcome = await _screen(ctx)
    with contextlib.suppress(Exception):  # the point: a caught error must not hide the call
        await ctx.call_model(LlmRequest(MODEL_ID, "anything else?"))
    return outcome


def not_an_agent() -> None:
    """Not an ``async def``."""


def decision(payment: dict[str, object], *, large: bool = False) -> str:
    """What the agents decide about ``payment``, computed without them (for the tests)."""
    number = int(str(payment["account"]).rsplit("-", 1)[1])
    flagged = number % 7 == 0 or (large and int(str(payment["amount"])) >= LARGE)
    return "flagged" if flagged else "ok"


def payments(
    count: int, keys: int, *, seed: int = 11, wait: bool = False
) -> list[dict[str, object]]:
    """``count`` payments spread over ``keys`` accounts, deterministic."""
    rng = random.Random(seed)
    return [
        {
            "id": f"p-{index:05d}",
            "account": f"acct-{index % keys:03d}",
            "amount": rng.randrange(1, 1_000),
            **({"wait": True} if wait else {}),
        }
        for index in range(count)
    ]


def envelopes(items: list[dict[str, object]]) -> list[AgentEnvelope]:
    """The payments as external events, one second apart."""
    return [
        AgentEnvelope(
            entity_key=str(payment["account"]).encode(),
            event_time_ms=1_767_225_600_000 + 1_000 * index,
            external_event=canonical_json_bytes(payment),
        )
        for index, payment in enumerate(items)
    ]
