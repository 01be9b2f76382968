"""Agents whose read-only tools return rich values, for replaying tool results.

``scored`` reads an attribute of a Pydantic model its tool returns (a replay must hand the model
back, not a dict); ``locked`` gets a value with no JSON form, which cannot be recorded.
"""

from __future__ import annotations

import threading

from pydantic import BaseModel

from beam_agents import AgentConfig
from beam_agents.core.agent import Complete
from beam_agents.core.context import ActivationContext
from beam_agents.tools import ToolRegistry, tool


class Score(BaseModel):
    """A risk score."""

    account: str
    score: int


@tool
def score(account: str) -> Score:
    """The account's risk score.

    Args:
        account: the account.
    """
    return Score(account=account, score=len(account))


@tool
def lock(account: str) -> object:
    """A lock for the account (no JSON form).

    Args:
        account: the account.
    """
    return threading.Lock()


def make_config() -> AgentConfig:
    """Both tools, recording."""
    return AgentConfig(tool_registry=ToolRegistry([score, lock]), record=True)


async def scored(ctx: ActivationContext) -> Complete:
    """Completes with the score's ``score`` attribute."""
    result = await ctx.run_tool("score", {"account": ctx.entity_key.decode()})
    return Complete(str(result.score).encode())


async def locked(ctx: ActivationContext) -> Complete:
    """Completes with the lock's type name."""
    result = await ctx.run_tool("lock", {"account": ctx.entity_key.decode()})
    return Complete(type(result).__name__.encode())
