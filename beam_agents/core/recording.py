"""Temporary alias (issue 41): beam_agents.core.recording moved to beam_agents.core.observability."""
import sys
from beam_agents.core import observability as _moved
sys.modules[__name__] = _moved
