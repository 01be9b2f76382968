"""beam-agents: LLM agents as keyed, stateful, fault-tolerant Apache Beam transforms.

Every name a pipeline needs is importable from here, e.g.
``from beam_agents import RunAgent, AgentConfig, FakeLLM``. The names are imported lazily, on
first use, so that ``import beam_agents`` and the Beam-free packages under it
(``beam_agents.tools`` and ``beam_agents.model``, which the effector sidecar imports) never pull
in Apache Beam; type checkers read the real types from the imports under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from beam_agents._protos import (
        AgentEnvelope,
        Approval,
        ToolIntent,
        ToolResult,
        canonical_json,
        canonical_json_bytes,
    )
    from beam_agents.core.agent import Complete, Suspend
    from beam_agents.core.config import AgentConfig
    from beam_agents.core.context import ActivationContext
    from beam_agents.core.ids import intent_id_for
    from beam_agents.core.transform import RunAgent, RunAgentOutputs
    from beam_agents.hitl import Deny, Drop, Escalate, FallbackContext, HitlPolicy, Route
    from beam_agents.io import (
        EffectorConnection,
        ExportTraces,
        ReadEnvelopes,
        SubmitIntents,
        WriteErrors,
        WriteRecords,
        WriteRecordsToEffector,
        WriteTraces,
    )
    from beam_agents.model import FakeLLM, LlmRequest, LlmResponse
    from beam_agents.tools import IntentInfo, Reconciled, ToolRegistry, tool

    __version__: str

# Each public name and the module it is imported from. Keep in step with the imports above
# (tests/test_public_api.py checks that they agree).
_LAZY_EXPORTS = {
    "ActivationContext": "beam_agents.core.context",
    "AgentConfig": "beam_agents.core.config",
    "AgentEnvelope": "beam_agents._protos",
    "Approval": "beam_agents._protos",
    "Complete": "beam_agents.core.agent",
    "Deny": "beam_agents.hitl",
    "Drop": "beam_agents.hitl",
    "EffectorConnection": "beam_agents.io",
    "Escalate": "beam_agents.hitl",
    "ExportTraces": "beam_agents.io",
    "FakeLLM": "beam_agents.model",
    "FallbackContext": "beam_agents.hitl",
    "HitlPolicy": "beam_agents.hitl",
    "IntentInfo": "beam_agents.tools",
    "LlmRequest": "beam_agents.model",
    "LlmResponse": "beam_agents.model",
    "ReadEnvelopes": "beam_agents.io",
    "Reconciled": "beam_agents.tools",
    "Route": "beam_agents.hitl",
    "RunAgent": "beam_agents.core.transform",
    "RunAgentOutputs": "beam_agents.core.transform",
    "SubmitIntents": "beam_agents.io",
    "Suspend": "beam_agents.core.agent",
    "ToolIntent": "beam_agents._protos",
    "ToolRegistry": "beam_agents.tools",
    "ToolResult": "beam_agents._protos",
    "WriteErrors": "beam_agents.io",
    "WriteRecords": "beam_agents.io",
    "WriteRecordsToEffector": "beam_agents.io",
    "WriteTraces": "beam_agents.io",
    "canonical_json": "beam_agents._protos",
    "canonical_json_bytes": "beam_agents._protos",
    "intent_id_for": "beam_agents.core.ids",
    "tool": "beam_agents.tools",
}

__all__ = [
    "ActivationContext",
    "AgentConfig",
    "AgentEnvelope",
    "Approval",
    "Complete",
    "Deny",
    "Drop",
    "EffectorConnection",
    "Escalate",
    "ExportTraces",
    "FakeLLM",
    "FallbackContext",
    "HitlPolicy",
    "IntentInfo",
    "LlmRequest",
    "LlmResponse",
    "ReadEnvelopes",
    "Reconciled",
    "Route",
    "RunAgent",
    "RunAgentOutputs",
    "SubmitIntents",
    "Suspend",
    "ToolIntent",
    "ToolRegistry",
    "ToolResult",
    "WriteErrors",
    "WriteRecords",
    "WriteRecordsToEffector",
    "WriteTraces",
    "__version__",
    "canonical_json",
    "canonical_json_bytes",
    "intent_id_for",
    "tool",
]

_DISTRIBUTION = "beam-agents"
_UNKNOWN_VERSION = "0+unknown"
"""``__version__`` when the package runs from a source tree that was never installed."""


def _version() -> str:
    """The installed distribution's version, or :data:`_UNKNOWN_VERSION`."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(_DISTRIBUTION)
    except PackageNotFoundError:
        return _UNKNOWN_VERSION


def __getattr__(name: str) -> Any:
    """Import a public name on first use and keep it in the module's namespace."""
    if name == "__version__":
        value: Any = _version()
    else:
        module_name = _LAZY_EXPORTS.get(name)
        if module_name is None:
            raise AttributeError(f"module 'beam_agents' has no attribute {name!r}")
        value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
