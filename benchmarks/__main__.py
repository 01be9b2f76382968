"""``python -m benchmarks``: see :func:`benchmarks.harness.main`."""

import sys

from benchmarks.harness import main

sys.exit(main())
