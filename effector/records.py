"""Paging a key's stored activation records back out, for ``ListRecords``.

The pipeline's ``.records`` (``AgentConfig(record=...)``) reach the effector through
``RecordActivations`` (checked by ``intents.activation_record_problem``) and are read back a
key at a time, in pages of whole runs (a run's records replay together): each page holds the
newest runs before a seq, in commit order, and says where the next, older page ends.
"""

from __future__ import annotations

from collections.abc import Sequence

from beam_agents._protos import ActivationRecord, ListRecordsRequest
from effector.intents import MAX_ENTITY_KEY_BYTES

DEFAULT_RUNS = 100
"""Runs per ListRecords page when the request leaves ``max_runs`` at 0."""
MAX_RUNS = 1_000
"""The most runs one ListRecords page holds."""


def list_records_problem(request: ListRecordsRequest) -> str | None:
    """Why a ListRecords request is invalid, or ``None``."""
    if not 0 < len(request.entity_key) <= MAX_ENTITY_KEY_BYTES:
        return f"entity_key must be 1 to {MAX_ENTITY_KEY_BYTES} bytes"
    if request.max_runs < 0 or request.before_seq < 0:
        return "max_runs and before_seq must not be negative"
    return None


def records_page(
    records: Sequence[ActivationRecord], max_runs: int, max_bytes: int
) -> tuple[list[ActivationRecord], int]:
    """The page to answer with, of ``records`` (a key's newest runs, at most ``max_runs``).

    While the page is over ``max_bytes`` its oldest run is left for the next page (the newest
    run always stays). Returns the page and the next page's ``before_seq`` (0: no more).
    """
    sizes: dict[int, int] = {}
    for record in records:
        sizes[record.seq] = sizes.get(record.seq, 0) + record.ByteSize() + 16  # tag, length
    runs = sorted(sizes)
    kept = total = 0
    for seq in reversed(runs):
        if kept and total + sizes[seq] > max_bytes:
            break
        kept, total = kept + 1, total + sizes[seq]
    if not kept:
        return [], 0
    oldest = runs[-kept]
    more = kept < len(runs) or len(runs) >= max_runs
    return [record for record in records if record.seq >= oldest], oldest if more else 0
