"""Temporary alias (issue 41): beam_agents.model.messages moved to beam_agents.model.client."""
import sys
from beam_agents.model import client as _moved
sys.modules[__name__] = _moved
