"""The conformance scenario every adapter case plays: one event, one triage conversation.

An event is ``{"id", "account", "amount", "approval"}``. The agent (whatever framework wrote
it) offers the model two registry tools: ``lookup_account`` (read-only, runs inline) and
``apply_effect`` (side-effecting, from ``tests.semantics.gate_tools``: the effector executes it
into the ledger). The scripted model (:func:`triage_model`) reads only the neutral
conversation, so it answers every framework the same way:

1. no tool result yet: call ``lookup_account(account)``;
2. the lookup answered: call ``apply_effect(event_id, amount)``;
3. ``apply_effect`` answered: the final text ``APPLIED <result JSON>``, or ``NOT APPLIED:
   <what the tool message said>`` when it reports an error (failed, denied, rejected).

When the event says ``"approval": true`` the agent must ask a person before ``apply_effect``
runs, in its framework's own way (LangGraph ``interrupt()``, a Pydantic AI approval-required
tool, an ADK tool confirmation, ``ctx.request_approval``); a denial reaches the model as the
tool's error, so the run ends ``NOT APPLIED``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from beam_agents import FakeLLM, LlmRequest, ToolRegistry, tool
from beam_agents.model.client import LlmResponse, ToolCall
from beam_agents.model.fake import match_any, respond_with_fn
from tests.semantics.gate_tools import apply_effect

MODEL_ID = "triage-model"
SYSTEM_PROMPT = "You triage account events. Look the account up, then apply the effect."
APPLIED = "APPLIED"
NOT_APPLIED = "NOT APPLIED"


@tool
def lookup_account(account: str) -> dict[str, Any]:
    """Look an account up (read-only).

    Args:
        account: The account id.
    """
    return {"account": account, "risk": len(account) % 7, "status": "open"}


def triage_registry() -> ToolRegistry:
    """The pipeline's registry: the read-only lookup and the side-effecting ``apply_effect``."""
    return ToolRegistry([lookup_account, apply_effect])


def event_payload(event_id: str, *, account: str, amount: int, approval: bool = False) -> bytes:
    """One conformance event's bytes."""
    return json.dumps(
        {"id": event_id, "account": account, "amount": amount, "approval": approval},
        sort_keys=True,
    ).encode()


def user_prompt(event: bytes) -> str:
    """What every case tells the model about the event: its JSON, verbatim."""
    return event.decode("utf-8")


def _event_of(messages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    for message in messages:
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str) and content.startswith("{"):
                return dict(json.loads(content))
    raise AssertionError(f"no event JSON among the user messages: {messages!r}")


def _tool_messages(messages: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [message for message in messages if message.get("role") == "tool"]


def _names_by_call_id(messages: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    names: dict[str, str] = {}
    for message in messages:
        for call in message.get("tool_calls") or ():
            names[str(call["id"])] = str(call["name"])
    return names


def triage_answer(request: LlmRequest) -> tuple[str, tuple[ToolCall, ...]]:
    """The scripted model's answer to ``request``: ``(text, tool_calls)``."""
    messages = list(request.messages)
    event = _event_of(messages)
    names = _names_by_call_id(messages)
    answered = {names.get(str(m.get("tool_call_id")), ""): m for m in _tool_messages(messages)}
    if "apply_effect" in answered:
        message = answered["apply_effect"]
        content = str(message.get("content", ""))
        if message.get("is_error") or _reads_as_error(content):
            return f"{NOT_APPLIED}: {content}", ()
        return f"{APPLIED} {content}", ()
    if "lookup_account" in answered:
        arguments = {"event_id": event["id"], "amount": event["amount"]}
        return "", (ToolCall(id=f"apply-{event['id']}", name="apply_effect", arguments=arguments),)
    arguments = {"account": event["account"]}
    return "", (ToolCall(id=f"lookup-{event['id']}", name="lookup_account", arguments=arguments),)


def _reads_as_error(content: str) -> bool:
    lowered = content.lower()
    return any(word in lowered for word in ("denied", "rejected", "not approved", "error"))


def triage_model() -> FakeLLM:
    """A fresh scripted model answering with :func:`triage_answer`."""
    fake: FakeLLM

    def respond(request: LlmRequest) -> bytes:
        text, calls = triage_answer(request)
        return fake.scripted_body(request, text, calls)

    fake = FakeLLM([(match_any(), respond_with_fn(respond))])
    return fake


def final_text(response: LlmResponse) -> str:
    """The model's final text (for cases that read it off a response)."""
    return response.text
