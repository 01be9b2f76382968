"""Replay and backtest: recorded activations read back, re-run offline, and compared."""

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
