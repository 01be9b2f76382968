"""Temporary alias (issue 41): beam_agents.core.memory moved to beam_agents.core.state."""
import sys
from beam_agents.core import state as _moved
sys.modules[__name__] = _moved
