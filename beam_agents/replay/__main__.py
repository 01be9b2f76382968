"""``python -m beam_agents.replay``: the ``beam-agents`` command.

The same as the console script ``beam-agents`` that the package installs: ``replay`` and
``backtest`` (see :mod:`beam_agents.replay.cli`).
"""

import sys

from beam_agents.replay.cli import main

sys.exit(main())
