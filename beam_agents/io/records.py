# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""Store ``RunAgent(...).records``: as files (``WriteRecords``) or in the effector.

A records file is :data:`MAGIC` followed by the records, each framed as a base-128 varint of
its length and then that many bytes of a deterministically serialized ``ActivationRecord``
(:func:`frame`). ``beam_agents.replay.recordfile`` reads them back; the format is described in
``beam_agents/replay/README.md``. :class:`WriteFramed` is the file sink for any message type
in that framing (``beam_agents.replay`` writes envelope files with it).
:class:`WriteRecordsToEffector` stores records in the effector's store, as ``WriteTraces`` does
trace events, for ``beam-agents replay --effector``.
"""

from __future__ import annotations

import functools
from typing import Any, BinaryIO

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.pvalue import PCollection
from apache_beam.transforms.window import FixedWindows
from google.protobuf.message import Message

from beam_agents._protos import (
    ActivationRecord,
    RecordActivationsRequest,
    RecordActivationsResponse,
)
from beam_agents.io.telemetry import _Sink, _varint, _WriteTelemetry

__all__ = ["MAGIC", "SUFFIX", "WriteFramed", "WriteRecords", "WriteRecordsToEffector", "frame"]

MAGIC = b"BEAM-AGENTS-RECORDS/1\n"
"""The first bytes of every records file (format version 1)."""

SUFFIX = ".records"
"""The file name suffix of records files; a directory is read as its ``*.records`` files."""


def frame(message: Message) -> bytes:
    """``message`` as it is stored in a framed file: varint length, then the message."""
    body = message.SerializeToString(deterministic=True)
    return _varint(len(body)) + body


class _FramedFileSink(fileio.FileSink):
    """Writes the format's header, then one framed message per element."""

    def __init__(self, magic: bytes) -> None:
        self._magic = magic

    def open(self, fh: BinaryIO) -> None:
        """Start a file."""
        self._file = fh
        fh.write(self._magic)

    def write(self, message: Message) -> None:
        """Append one message."""
        self._file.write(frame(message))

    def flush(self) -> None:
        """Flush the file."""
        self._file.flush()


def _sink_for(magic: bytes, destination: object) -> _FramedFileSink:
    return _FramedFileSink(magic)


class WriteFramed(beam.PTransform[PCollection[Message], Any]):
    """Write messages to ``path`` (a directory; local or any Beam filesystem), framed.

    Subclasses name the format: :attr:`MAGIC` (each file's header), :attr:`PREFIX` and
    :attr:`SUFFIX` (files are ``PREFIX-SSSSS-of-NNNNN SUFFIX``). Unbounded input is first
    windowed into fixed ``window_s`` event-time windows (the window is then in the file names)
    so that files are finished as the stream goes. ``shards``: files per window (Beam's
    default when ``None``).
    """

    MAGIC = MAGIC
    PREFIX = "records"
    SUFFIX = SUFFIX

    def __init__(self, path: str, *, shards: int | None = None, window_s: int = 60) -> None:
        super().__init__()
        name = type(self).__name__
        if not isinstance(path, str) or not path:
            raise ValueError(f"{name} needs a directory path, got {path!r}")
        if window_s <= 0:
            raise ValueError(f"{name} window_s must be positive, got {window_s!r}")
        self._path = path
        self._shards = shards
        self._window_s = window_s

    def expand(self, messages: PCollection[Message]) -> Any:
        """Window unbounded input, then write the files."""
        if not messages.is_bounded:
            messages = messages | "Window" >> beam.WindowInto(FixedWindows(self._window_s))
        return messages | "Files" >> fileio.WriteToFiles(
            self._path,
            file_naming=fileio.default_file_naming(self.PREFIX, self.SUFFIX),
            sink=functools.partial(_sink_for, self.MAGIC),
            shards=self._shards,
        )


class WriteRecords(WriteFramed):
    """Write ``ActivationRecord``s to ``path`` (a directory; local or any Beam filesystem).

    Files are named ``records-SSSSS-of-NNNNN.records`` (with the window in the name for
    unbounded input, which is first windowed into fixed ``window_s`` event-time windows so
    that files are finished as the stream goes). ``shards``: files per window (Beam's default
    when ``None``).
    """


_RECORDS = _Sink(
    transform="WriteRecordsToEffector",
    item_type=ActivationRecord,
    rpc="RecordActivations",
    request_type=RecordActivationsRequest,
    field="records",
    response_type=RecordActivationsResponse,
    noun="activation record",
    metric="records",
)


class WriteRecordsToEffector(_WriteTelemetry):
    """Store ``RunAgent(...).records`` in the effector, for ``beam-agents replay --effector``.

    Behaves as ``WriteTraces`` does, with the same arguments: batches per bundle, transient
    failures retried, what cannot be stored (an unreachable effector, a record it refuses)
    dropped, counted and logged (one WARNING per bundle), never failing the pipeline; a wrong
    token fails it with ``PermissionError``. Retrying and running the pipeline again are safe:
    the effector stores each ``(entity_key, seq, trace_sequence)`` once. Beam metrics
    (namespace ``beam_agents.io``): ``records_recorded``, ``records_duplicate``,
    ``records_dropped``, ``records_retries``.
    """

    _sink = _RECORDS
