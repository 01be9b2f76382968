"""``python -m effector``: the same command line as ``beam-agents-effector``."""

from effector.cli import main

raise SystemExit(main())
