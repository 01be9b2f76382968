"""beam-agents: LLM agents as keyed, stateful, fault-tolerant Apache Beam transforms.

The names below are imported lazily, so that ``beam_agents.tools`` and ``beam_agents.model``
(which the effector sidecar imports) never pull in Apache Beam.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY_EXPORTS = {
    "RunAgent": "beam_agents.core.transform",
    "AgentConfig": "beam_agents.core.config",
    "RunAgentOutputs": "beam_agents.core.transform",
    "Complete": "beam_agents.core.agent",
    "Suspend": "beam_agents.core.agent",
    "FallbackContext": "beam_agents.hitl",
    "intent_id_for": "beam_agents.core.ids",
    "HitlPolicy": "beam_agents.hitl",
    "Deny": "beam_agents.hitl",
    "Drop": "beam_agents.hitl",
    "Escalate": "beam_agents.hitl",
    "Route": "beam_agents.hitl",
}

__all__ = sorted(_LAZY_EXPORTS)


def __getattr__(name: str) -> Any:
    module_name = _LAZY_EXPORTS.get(name)
    if module_name is None:
        raise AttributeError(f"module 'beam_agents' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY_EXPORTS])
