"""Temporary alias (issue 41): beam_agents.io.submit moved to beam_agents.io.effector_link."""
import sys
from beam_agents.io import effector_link as _moved
sys.modules[__name__] = _moved
