"""The conformance scenario as a Pydantic AI agent, run by ``PydanticAIAgent``.

The agent is plain Pydantic AI: a system prompt and the registry tools (``BeamToolset``),
``apply_effect`` approval-required when the event says ``"approval": true`` (the run's deps).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic_ai import Agent, RunContext
from pydantic_ai.tools import ToolDefinition

from beam_agents.adapters.pydantic_ai import PydanticAIAgent, beam_toolset
from tests.adapters import scenario


def event_deps(event: bytes) -> dict[str, Any]:
    """The run's deps: the event itself."""
    return dict(json.loads(event))


def needs_approval(
    ctx: RunContext[dict[str, Any]], tool: ToolDefinition, args: dict[str, Any]
) -> bool:
    """``apply_effect`` waits for a person when the event asks for approval."""
    return tool.name == "apply_effect" and bool(ctx.deps.get("approval"))


def build_triage_agent() -> Agent[dict[str, Any], str]:
    """The triage agent (the model is given per run by the adapter)."""
    return Agent(system_prompt=scenario.SYSTEM_PROMPT, deps_type=dict, output_type=str)


triage = PydanticAIAgent(
    build_triage_agent,
    model_id=scenario.MODEL_ID,
    prompt=scenario.user_prompt,
    deps=event_deps,
    toolsets=[beam_toolset(approval_required=needs_approval)],
)
triage_agent = triage
"""The ``RunAgent`` agent."""
