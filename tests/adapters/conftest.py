"""The adapter tests import the effector test harness as a top-level module, as tests/io does."""

from __future__ import annotations

import sys
from pathlib import Path

_EFFECTOR_TESTS = str(Path(__file__).resolve().parent.parent / "effector")
if _EFFECTOR_TESTS not in sys.path:
    sys.path.insert(0, _EFFECTOR_TESTS)

import pytest  # noqa: E402

pytest.register_assert_rewrite("tests.adapters.conformance", "tests.semantics.loop")

# Every module's pipelines weigh Beam's state cache values without walking every module.
from tests.semantics.state_cache import module_walk_free_state_cache  # noqa: E402, F401
