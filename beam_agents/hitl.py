"""Human in the loop, at the path the upstream documentation imports (a compatibility module).

The policy lives with the configuration in :mod:`beam_agents.core.config`, and
:class:`FallbackContext` with the agent outcomes in :mod:`beam_agents.core.agent`; this module
re-exports them so ``from beam_agents.hitl import HitlPolicy`` keeps working.
"""

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
