"""Human in the loop: re-exports the HITL policy from ``core.config`` at its upstream path."""

from __future__ import annotations

from beam_agents.core.agent import FallbackContext
from beam_agents.core.config import (
    MAX_REQUIRED_APPROVALS,
    Deny,
    Drop,
    Escalate,
    HitlPolicy,
    Route,
    TimeoutRoute,
    check_required_approvals,
)

__all__ = [
    "MAX_REQUIRED_APPROVALS",
    "Deny",
    "Drop",
    "Escalate",
    "FallbackContext",
    "HitlPolicy",
    "Route",
    "TimeoutRoute",
    "check_required_approvals",
]
