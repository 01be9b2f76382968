"""``python -m effector``: the same command line as ``beam-agents-effector``.

See :mod:`effector.cli`.
"""

from effector.cli import main

raise SystemExit(main())
