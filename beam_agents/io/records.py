"""Temporary alias (issue 41): beam_agents.io.records moved to beam_agents.io.sinks."""
import sys
from beam_agents.io import sinks as _moved
sys.modules[__name__] = _moved
