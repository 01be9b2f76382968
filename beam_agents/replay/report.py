"""Temporary alias (issue 41): beam_agents.replay.report moved to beam_agents.replay.backtest."""
import sys
from beam_agents.replay import backtest as _moved
sys.modules[__name__] = _moved
