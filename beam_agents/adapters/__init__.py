"""Bring your agent: LangGraph, Pydantic AI and Google ADK agents as ``RunAgent`` agents.

Each framework has its own module (``beam_agents.adapters.langgraph``, ``.pydantic_ai``,
``.adk``), imported only when asked for: importing ``beam_agents`` never imports a framework.
How an adapter maps a framework run onto activations is in ``beam_agents/adapters/README.md``.
"""

from beam_agents.adapters._bridge import (
    ActivationBridge,
    AdapterUsageError,
    Decision,
    IntentFailedError,
    Pending,
    current_bridge,
)

__all__ = [
    "ActivationBridge",
    "AdapterUsageError",
    "Decision",
    "IntentFailedError",
    "Pending",
    "current_bridge",
]
