"""Fixtures shared by the reliability gates, and the ``GATE <name>:`` summary at the end.

Each gate reports its figures through the ``gate_report`` fixture; they are printed as one
line per gate starting with ``GATE <name>:`` in pytest's terminal summary (so they show
without ``-s``); a gate made of several tests gets their figures joined on its line. Each
test's own figures are also in its captured output (shown when it fails). The figures travel
on the test's report (``tests/conftest.py`` prints them), so they reach the summary from
parallel test workers too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

# The effector's test harness lives beside its tests and is imported as a top-level module
# (as pytest imports it there); make it importable from here too, as tests/io does.
_EFFECTOR_TESTS = str(Path(__file__).resolve().parent.parent / "effector")
if _EFFECTOR_TESTS not in sys.path:
    sys.path.insert(0, _EFFECTOR_TESTS)

import pytest  # noqa: E402

# The gates' shared checks live in a helper module: have pytest explain its failing asserts.
pytest.register_assert_rewrite("tests.semantics.loop")

from tests.conftest import GATE_PROPERTY  # noqa: E402
from tests.pg import PostgresServer, postgres_server  # noqa: E402
from tests.semantics.gate_tools import create_ledger  # noqa: E402

# Every module's pipelines weigh Beam's state cache values without walking every module.
from tests.semantics.state_cache import module_walk_free_state_cache  # noqa: E402, F401


@pytest.fixture
def gate_report(request: pytest.FixtureRequest) -> Callable[[str, str], None]:
    """``gate_report(name, figures)`` adds ``figures`` to gate ``name``'s summary line."""

    def report(name: str, figures: str) -> None:
        request.node.user_properties.append((GATE_PROPERTY, (name, figures)))
        print(f"GATE {name}: {figures}", flush=True)

    return report


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A throwaway PostgreSQL server for the session."""
    with postgres_server() as server:
        yield server


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    """An empty gate-tool ledger (the sidecars name it to their effectors)."""
    return create_ledger(tmp_path / "ledger.db")
