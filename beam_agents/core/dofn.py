"""Temporary alias (issue 41): beam_agents.core.dofn moved to beam_agents.io.run_agent."""
import sys
from beam_agents.io import run_agent as _moved
sys.modules[__name__] = _moved
