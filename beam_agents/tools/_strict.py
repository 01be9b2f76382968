"""Temporary alias (issue 41): beam_agents.tools._strict moved to beam_agents.tools._schema."""
import sys
from beam_agents.tools import _schema as _moved
sys.modules[__name__] = _moved
