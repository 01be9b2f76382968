"""Temporary alias (issue 41): beam_agents.core.retry_memo moved to beam_agents.core.model_calls."""
import sys
from beam_agents.core import model_calls as _moved
sys.modules[__name__] = _moved
