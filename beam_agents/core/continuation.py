"""Temporary alias (issue 41): beam_agents.core.continuation moved to beam_agents.core.activation."""
import sys
from beam_agents.core import activation as _moved
sys.modules[__name__] = _moved
