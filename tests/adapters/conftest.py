"""The adapter tests import the effector test harness as a top-level module, as tests/io does."""

from __future__ import annotations

import sys
from pathlib import Path

_EFFECTOR_TESTS = str(Path(__file__).resolve().parent.parent / "effector")
if _EFFECTOR_TESTS not in sys.path:
    sys.path.insert(0, _EFFECTOR_TESTS)

import pytest  # noqa: E402

pytest.register_assert_rewrite("tests.adapters.conformance", "tests.semantics.loop")
