"""An effect policy for the console's tests, the tools it rules on, and intents submitted to it.

Intents go through the effector's real Submit (gRPC), so the policy decides them at intake as
in production: ``no-big-sums`` denies, ``two-eyes`` holds for approval, ``small-pays`` allows,
and the file's default denies any other tool.
"""

from __future__ import annotations

import json
from pathlib import Path

from beam_agents._protos import SubmitAck, ToolIntent
from beam_agents.core.agent import intent_id_for
from beam_agents.tools import ToolRegistry, tool
from effector.client import EffectorClient
from effector.launch import EffectorThread
from tests.console.runs_data import now_ms

POLICY = """\
default = "deny"

[counters.pays_per_key]
tool = "pay"
per = "key"
window = "1h"

[[rules]]
name = "no-big-sums"
when = 'tool == "pay" && args.cents > 100000'
outcome = "deny"
reason = "sums over 1,000.00 are never paid"

[[rules]]
name = "two-eyes"
when = 'tool == "pay" && (args.cents > 1000 || counters.pays_per_key >= 10)'
outcome = "require_approval"
channel = "finance"

[[rules]]
name = "small-pays"
when = 'tool == "pay"'
outcome = "allow"
"""
RULE_LINES = {"no-big-sums": 8, "two-eyes": 14, "small-pays": 20}
"""The line of each rule's ``[[rules]]`` header in :data:`POLICY`."""


@tool(side_effect=True)
def pay(account: str, cents: int) -> str:
    """Pay an account.

    :param account: Whom to pay.
    :param cents: How much.
    """
    return f"paid {cents} to {account}"


@tool(side_effect=True)
def note(text: str) -> str:
    """Write a note (no rule names it: the policy's default decides).

    :param text: What to write.
    """
    return text


def registry() -> ToolRegistry:
    """The tools the policy rules on."""
    return ToolRegistry([pay, note])


def write_policy(directory: Path, text: str = POLICY, name: str = "policy.toml") -> Path:
    """``text`` as a policy file in ``directory``."""
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def tool_intent(key: bytes, seq: int, tool_name: str, args: dict[str, object]) -> ToolIntent:
    """A TOOL intent as an agent stages it (step 3)."""
    return ToolIntent(
        intent_id=intent_id_for(key, seq, 3),
        entity_key=key,
        seq=seq,
        step_index=3,
        tool_name=tool_name,
        args_json=json.dumps(args, sort_keys=True, separators=(",", ":")),
        created_at_ms=now_ms(),
        kind=ToolIntent.TOOL,
    )


def submit_intents(effector: EffectorThread, *intents: ToolIntent) -> list[SubmitAck]:
    """Submit ``intents`` through the effector's gRPC Submit: the policy decides them."""
    with EffectorClient(effector.address) as client:
        return client.submit(intents)
