"""Replay and backtest: recorded activations read back, re-run offline, and compared.

``RunAgent`` records with ``AgentConfig(record=True)`` and ``WriteRecords(path)`` stores the
records; the ``beam-agents`` command (:mod:`.cli`) replays them against the current agent code
(:func:`replay`) or backtests a candidate over them as a Beam pipeline (``backtest``), or over
envelope files (:func:`write_envelopes`, :class:`WriteEnvelopes`) with no recording. The
format, the rules and the report are in ``docs/replay.md``.
"""

from beam_agents.replay.inputs import (
    EnvelopeFileError,
    RecordFileError,
    WriteEnvelopes,
    by_key,
    read_records,
    write_envelopes,
)
from beam_agents.replay.replay import RunReport, exit_status, replay

__all__ = [
    "EnvelopeFileError",
    "RecordFileError",
    "RunReport",
    "WriteEnvelopes",
    "by_key",
    "exit_status",
    "read_records",
    "replay",
    "write_envelopes",
]
