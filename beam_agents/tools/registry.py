"""Temporary alias (issue 41): beam_agents.tools.registry moved to beam_agents.tools._tool."""
import sys
from beam_agents.tools import _tool as _moved
sys.modules[__name__] = _moved
