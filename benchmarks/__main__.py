"""``python -m benchmarks``: see :mod:`benchmarks.run_all`."""

import sys

from benchmarks.run_all import main

sys.exit(main())
