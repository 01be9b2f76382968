"""What the whole suite shares: the reliability gates' ``GATE <name>:`` terminal summary.

A gate's figures ride on its test's report as a user property (``tests/semantics/conftest.py``
adds them), so they arrive here from parallel test workers (``make test``) as in one process.
"""

from __future__ import annotations

import pytest

GATE_PROPERTY = "gate"
"""The user property carrying ``(gate name, figures)`` on a gate test's reports."""

_GATE_FIGURES: dict[str, list[str]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Keep the figures of each finished gate test (its teardown report has them all)."""
    if report.when != "teardown":
        return
    for key, value in report.user_properties:
        if key == GATE_PROPERTY:
            name, figures = value
            _GATE_FIGURES.setdefault(name, []).append(figures)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print one line per gate at the end of the session."""
    if _GATE_FIGURES:
        terminalreporter.section("reliability gates")
        for name, figures in _GATE_FIGURES.items():
            terminalreporter.write_line(f"GATE {name}: {' | '.join(figures)}")
