"""Human in the loop: re-exports the HITL policy from ``core.config`` at its upstream path."""

from __future__ import annotations

from beam_agents.core.agent import FallbackContext
from beam_agents.core.config import (
    Deny,
    Drop,
    Escalate,
    HitlPolicy,
    Route,
    TimeoutRoute,
)

__all__ = [
    "Deny",
    "Drop",
    "Escalate",
    "FallbackContext",
    "HitlPolicy",
    "Route",
    "TimeoutRoute",
]
