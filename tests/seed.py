"""The seed example program (``examples/read_only_tools.py``), imported for tests to reuse.

The seed runs as a script, so it is not in a package. Loading it here
once, under its own module name, lets tests use its tools and agent (pickled by reference
like any module-level tool) instead of copying them.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SEED_PATH = Path(__file__).resolve().parent.parent / "examples" / "read_only_tools.py"
MODULE_NAME = "read_only_tools"


def _load() -> object:
    if MODULE_NAME in sys.modules:
        return sys.modules[MODULE_NAME]
    spec = importlib.util.spec_from_file_location(MODULE_NAME, SEED_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    spec.loader.exec_module(module)
    return module


seed = _load()
risk_band = seed.risk_band  # type: ignore[attr-defined]
freeze_account = seed.freeze_account  # type: ignore[attr-defined]
make_registry = seed.make_registry  # type: ignore[attr-defined]
make_provider = seed.make_provider  # type: ignore[attr-defined]
