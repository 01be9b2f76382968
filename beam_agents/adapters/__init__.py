"""Bring your agent: LangGraph, Pydantic AI and Google ADK agents as ``RunAgent`` agents.

Each framework has its own subpackage (``beam_agents.adapters.langgraph``, ``.pydantic_ai``,
``.adk``), imported only when asked for: importing ``beam_agents`` never imports a framework.
How an adapter maps a framework run onto activations is in ``docs/adapters.md``.
"""

from beam_agents.adapters.base import (
    AdapterActivation,
    AdapterUsageError,
    Decision,
    IntentFailedError,
    Pending,
    current_activation,
)

__all__ = [
    "AdapterActivation",
    "AdapterUsageError",
    "Decision",
    "IntentFailedError",
    "Pending",
    "current_activation",
]
