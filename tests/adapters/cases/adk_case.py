"""The conformance scenario as a Google ADK ``LlmAgent``, run by ``AdkAgent``.

The agent offers the registry's tools through ``beam_tools``; when the event says
``"approval": true`` (put into the session state by the ``state`` hook), ``apply_effect`` asks
for ADK tool confirmation, which the adapter turns into an approval intent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.tools.tool_context import ToolContext

from beam_agents.adapters.adk import AdkAgent, beam_tools
from tests.adapters.scenario import MODEL_ID, SYSTEM_PROMPT, triage_registry, user_prompt


def needs_approval(tool_name: str, arguments: Mapping[str, Any], context: ToolContext) -> bool:
    """``apply_effect`` waits for a person when the run's event asked for approval."""
    return tool_name == "apply_effect" and bool(context.state.get("approval"))


def event_state(event: bytes) -> dict[str, Any]:
    """What the run's event puts into the session state."""
    return {"approval": bool(json.loads(event).get("approval"))}


def build_triage() -> LlmAgent:
    """The ADK agent: the scenario's prompt, model id and registry tools."""
    return LlmAgent(
        name="triage",
        model=MODEL_ID,
        instruction=SYSTEM_PROMPT,
        tools=beam_tools(triage_registry(), require_confirmation=needs_approval),
    )


triage_agent = AdkAgent(build_triage, app_name="triage", prompt=user_prompt, state=event_state)
