# mypy: disallow-untyped-calls=False
# (Beam's filesystem API is unannotated.)
"""Reading records files (``WriteRecords``'s framing) back, and ordering a key's records.

:func:`read_records` takes files, directories (their ``*.records`` files, at any depth) or
glob patterns on any Beam filesystem and refuses a file that is not a whole records file with a
:class:`RecordFileError` naming it and the byte offset. :func:`by_key` groups records by key in
the order their key committed them. :func:`parse_framed` and :func:`expand` read any file in
the same framing (``envelopes`` reads envelope files with them). The format:
``beam_agents/replay/README.md``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from google.protobuf.message import DecodeError, Message

from beam_agents._protos import ActivationRecord
from beam_agents.core.recording import RECORD_SCHEMA_VERSION
from beam_agents.io.records import MAGIC, SUFFIX, frame

__all__ = [
    "RECORDS",
    "FramedFileError",
    "Framing",
    "RecordFileError",
    "by_key",
    "check_readable",
    "encode_records",
    "expand",
    "parse_framed",
    "parse_records",
    "read_bytes",
    "read_file",
    "read_records",
]

M = TypeVar("M", bound=Message)


class FramedFileError(ValueError):
    """A framed file (records, envelopes) is missing, truncated, corrupt, or from a newer format."""


class RecordFileError(FramedFileError):
    """A records file is missing, truncated, corrupt, or from a newer format."""


@dataclass(frozen=True)
class Framing(Generic[M]):
    """A kind of framed file: its header, name suffix, message type, and error to raise."""

    kind: str
    """What the files hold, in messages (``records``)."""
    magic: bytes
    suffix: str
    message_type: type[M]
    error: type[FramedFileError]


RECORDS = Framing("records", MAGIC, SUFFIX, ActivationRecord, RecordFileError)


def _varint(data: bytes, offset: int) -> tuple[int, int]:
    """Decode the varint at ``offset``; return it and the offset after it."""
    value = shift = 0
    while True:
        if offset >= len(data):
            raise ValueError("the file ends inside an entry's length")
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7
        if shift > 63:
            raise ValueError("an entry's length is not a valid varint")


def parse_framed(data: bytes, name: str, framing: Framing[M]) -> list[tuple[int, M]]:
    """The messages of a framed file's bytes, each with its byte offset (``name``: in errors).

    The file is the framing's header, then each message as a varint of its length and its bytes.
    """
    magic, error = framing.magic, framing.error
    if not data.startswith(magic):
        raise error(f"{name} is not a beam-agents {framing.kind} file (no {magic!r} header)")
    messages = []
    offset = len(magic)
    while offset < len(data):
        start = offset
        try:
            length, offset = _varint(data, offset)
            if offset + length > len(data):
                raise ValueError(f"the file ends {offset + length - len(data)} bytes into an entry")
            message = framing.message_type.FromString(data[offset : offset + length])
        except (ValueError, DecodeError) as problem:
            raise error(f"{name} is corrupt at byte {start}: {problem}") from None
        messages.append((start, message))
        offset += length
    return messages


def parse_records(data: bytes, name: str = "<records>") -> list[ActivationRecord]:
    """The records in the bytes of one records file (``name`` is used in errors)."""
    records = []
    for start, record in parse_framed(data, name, RECORDS):
        check_readable(record, f"{name} has a record at byte {start}")
        records.append(record)
    return records


def check_readable(record: ActivationRecord, where: str) -> None:
    """Refuse a record of a newer schema version, or with no key (``where``: whose it is)."""
    if record.schema_version > RECORD_SCHEMA_VERSION or not record.entity_key:
        raise RecordFileError(
            f"{where} this version cannot read "
            f"(schema version {record.schema_version}, key {record.entity_key!r})"
        )


def encode_records(records: Iterable[ActivationRecord]) -> bytes:
    """A records file holding ``records`` (for tests and tools that write one file)."""
    return MAGIC + b"".join(frame(record) for record in records)


def _match(pattern: str, error: type[FramedFileError]) -> list[str]:
    try:
        return sorted(metadata.path for metadata in FileSystems.match([pattern])[0].metadata_list)
    except Exception as problem:  # Beam raises BeamIOError and others, by filesystem
        raise error(f"{pattern}: {problem}") from None


def _expand(path: str, framing: Framing[Any]) -> list[str]:
    """The files ``path`` names: a glob's matches, a directory's ``*SUFFIX``, or itself.

    A directory is searched at any depth, so the parent of a ``WriteRecords`` directory works.
    """
    suffix, error = framing.suffix, framing.error
    if any(char in path for char in "*?["):
        found = _match(path, error)
    else:
        found = _match(FileSystems.join(path, f"**{suffix}"), error)  # a directory
        if not found and path.endswith(suffix):
            found = _match(path, error)
    if not found:
        kind = framing.kind
        what = "no such file or directory" if not FileSystems.exists(path) else f"no {kind} files"
        raise error(f"{path}: {what} ({kind} files end in {suffix})")
    return found


def expand(paths: Sequence[str], framing: Framing[Any] = RECORDS) -> list[str]:
    """The framing's files ``paths`` name (files, directories or globs), sorted, once each."""
    return sorted({name for path in paths for name in _expand(path, framing)})


def read_records(paths: Sequence[str]) -> list[ActivationRecord]:
    """Every record in ``paths`` (files, directories or globs, on any Beam filesystem)."""
    return [record for name in expand(paths) for record in read_file(name)]


def read_bytes(name: str, error: type[FramedFileError] = RecordFileError) -> bytes:
    """The bytes of the file ``name`` (on any Beam filesystem); ``error`` if it cannot be read."""
    try:
        with FileSystems.open(name, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            data: bytes = handle.read()
    except OSError as problem:
        raise error(f"{name}: {problem}") from None
    return data


def read_file(name: str) -> list[ActivationRecord]:
    """The records in the records file ``name``."""
    return parse_records(read_bytes(name), name)


def order_key(record: ActivationRecord) -> tuple[int, int]:
    """Where ``record`` stands among its key's records: by run, then position in the run."""
    return record.seq, record.trace_sequence


def by_key(records: Iterable[ActivationRecord]) -> dict[bytes, list[ActivationRecord]]:
    """Records grouped by key (keys sorted), each key's in commit order, duplicates dropped.

    A record written twice (a retried bundle whose first attempt's file survived) is
    byte-identical to its twin and kept once.
    """
    grouped: dict[bytes, dict[tuple[int, int], ActivationRecord]] = {}
    for record in records:
        grouped.setdefault(record.entity_key, {}).setdefault(order_key(record), record)
    return {key: [runs[at] for at in sorted(runs)] for key, runs in sorted(grouped.items())}
