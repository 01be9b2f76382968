"""Temporary alias (issue 41): beam_agents.core.staging moved to beam_agents.core.context."""
import sys
from beam_agents.core import context as _moved
sys.modules[__name__] = _moved
