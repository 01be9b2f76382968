"""The conformance scenario written against the plain ``ctx`` API: the reference case.

It re-walks the conversation on every activation, as ``beam_agents.loop.run_tool_loop`` does,
and asks for approval with ``ctx.request_approval`` before ``apply_effect`` when the event says
so. The adapters must behave as this does.
"""

from __future__ import annotations

import json
from typing import Any

from beam_agents import ActivationContext, Complete, LlmRequest, Suspend
from beam_agents._protos import canonical_json
from beam_agents.loop import assistant_message, result_reply
from tests.adapters.scenario import MODEL_ID, SYSTEM_PROMPT, user_prompt


async def triage_agent(ctx: ActivationContext) -> Complete | Suspend:
    """Look the account up inline, apply the effect through the effector, report the result."""
    event = ctx.snapshot if ctx.is_resume else ctx.event
    wants_approval = bool(json.loads(event).get("approval"))
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": user_prompt(event)},
    ]
    tools = ctx.tool_registry.tools_schema
    while True:
        response = await ctx.call_model(LlmRequest(MODEL_ID, messages, tools))
        if not response.tool_calls:
            return Complete(output=response.text.encode("utf-8"))
        messages.append(assistant_message(response))
        for call in response.tool_calls:
            if not ctx.tool_registry.get(call.name).side_effect:
                value = await ctx.run_tool(call.name, call.arguments)
                content, is_error = canonical_json(value), False
            else:
                if wants_approval:
                    asked = ctx.request_approval({"tool": call.name, "arguments": call.arguments})
                    approval = ctx.approvals.get(asked)
                    refused = ctx.results.get(asked)
                    if approval is None and refused is None:
                        return Suspend(snapshot=event)
                    if approval is None or not approval.approved:
                        who = f"{approval.approver}: {approval.reason}" if approval else "expired"
                        messages.append(_tool_message(call.id, f"denied by {who}", True))
                        continue
                intent_id = ctx.act(call.name, call.arguments)
                result = ctx.results.get(intent_id)
                if result is None:  # the effector answers within the TTL: wait for it
                    return Suspend(snapshot=event, timeout_ms=ctx.intent_ttl_ms + 60_000)
                content, is_error = result_reply(call.name, result)
            messages.append(_tool_message(call.id, content, is_error))


def _tool_message(call_id: str, content: str, is_error: bool) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content, "is_error": is_error}
