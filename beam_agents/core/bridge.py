"""Temporary alias (issue 41): beam_agents.core.bridge moved to beam_agents.core.agent."""
import sys
from beam_agents.core import agent as _moved
sys.modules[__name__] = _moved
