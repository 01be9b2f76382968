"""``python -m beam_agents.replay``: the ``beam-agents`` command (``replay``, ``backtest``)."""

import sys

from beam_agents.replay.cli import main

sys.exit(main())
