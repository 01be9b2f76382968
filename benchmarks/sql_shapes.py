"""A SQL statement's shape: one line, its lists of parameters folded, for counting by statement.

A statement run over batches of different sizes is one shape, not one per size. Shapes are kept
whole for grouping and shortened only to be shown, so two statements that begin alike stay apart.
"""

from __future__ import annotations

import re

POSTGRES_PARAMETER = r"\$\d+"
SQLITE_PARAMETER = r"\?"


def shape(sql: str, parameter: str) -> str:
    """``sql`` on one line with its lists of ``parameter`` (a regular expression) folded."""
    row = rf"\({parameter}(?:, {parameter})*\)"
    text = re.sub(r"\s+", " ", sql).strip()
    text = re.sub(rf"{row}(?:, {row})*", "(...)", text)
    return re.sub(rf"{parameter}(?:, {parameter})+", "...", text)


def shortened(text: str, width: int = 70) -> str:
    """``text`` cut to ``width`` characters, an ellipsis marking the cut."""
    return text if len(text) <= width else text[: width - 3] + "..."


NOT_SUBMIT = {
    "SELECT state, COUNT(*) FROM effector_intents WHERE state IN": (
        "the worker's housekeeping count for its gauges (each housekeeping tick while cheap, "
        "less often as it slows: `GAUGE_COUNT_SHARE`; not run by Submit)"
    ),
    "SELECT state, COUNT(*) FROM effector_intents GROUP BY state": (
        "the Status call's count (not run by Submit)"
    ),
}
"""Statement shapes that no Submit runs, by prefix, and where they come from
(``effector/worker.py`` and ``effector/service.py``, through ``store.counts``)."""


def not_submit(text: str) -> str | None:
    """Where a statement shape no Submit runs comes from; ``None`` for any other shape."""
    return next((origin for prefix, origin in NOT_SUBMIT.items() if text.startswith(prefix)), None)
