# mypy: disallow-untyped-calls=False
# (Beam's filesystem API is unannotated.)
"""What replay and backtest read: records, envelope files, and what the command line names.

Records and envelope files share one framing: a header, then varint-length-prefixed messages.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from google.protobuf.message import DecodeError, Message

from beam_agents._protos import ActivationRecord, AgentEnvelope, ListRecordsRequest
from beam_agents.core.agent import is_agent
from beam_agents.core.config import AgentConfig
from beam_agents.core.context import AgentFn
from beam_agents.core.observability import RECORD_SCHEMA_VERSION
from beam_agents.io.effector_link import EffectorConnection
from beam_agents.io.sinks import MAGIC, SUFFIX, WriteFramed, frame


class BadInput(ValueError):
    """Input the command cannot use: it exits 2 with this one-line message."""


def load_object(spec: str, what: str) -> Any:
    """The object ``module:attribute`` names (``what`` names it in errors)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise BadInput(f"{what} must be given as module:attribute, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as problem:  # the user's module may fail in any way
        raise BadInput(f"cannot import {what} module {module_name!r}: {problem}") from None
    try:
        found = module
        for part in attribute.split("."):
            found = getattr(found, part)
    except AttributeError:
        raise BadInput(f"{what} {spec!r}: module {module_name!r} has no {attribute!r}") from None
    return found


def load_agent(spec: str) -> AgentFn:
    """The agent ``module:function`` names: an ``async def agent(ctx)``."""
    agent = load_object(spec, "agent")
    if not is_agent(agent):
        raise BadInput(f"agent {spec!r} is not an `async def agent(ctx)` function")
    return agent  # type: ignore[no-any-return]


def load_config(spec: str | None) -> AgentConfig:
    """The ``AgentConfig`` the zero-argument factory ``module:function`` returns (default one)."""
    if spec is None:
        return AgentConfig()
    factory: Callable[[], object] = load_object(spec, "config factory")
    if not callable(factory):
        raise BadInput(f"config factory {spec!r} is not callable")
    try:
        config = factory()
    except Exception as problem:  # the user's factory may fail in any way
        raise BadInput(f"config factory {spec!r} failed: {problem}") from None
    if not isinstance(config, AgentConfig):
        raise BadInput(f"config factory {spec!r} returned {type(config).__name__}, not AgentConfig")
    return config


def make_provider(config: AgentConfig) -> object | None:
    """The model client ``config.provider_factory`` makes (``None`` without one)."""
    if config.provider_factory is None:
        return None
    try:
        return config.provider_factory()
    except Exception as problem:  # the user's factory may fail in any way
        raise BadInput(f"the config's provider_factory failed: {problem}") from None


def parse_key(text: str) -> bytes:
    """A key as given on the command line: UTF-8 text, or ``hex:`` and its bytes in hex."""
    if text.startswith("hex:"):
        try:
            return bytes.fromhex(text[4:])
        except ValueError:
            raise BadInput(f"--key {text!r} is not valid hex") from None
    return text.encode("utf-8")


# -- framed files and records -------------------------------------------------------------
M = TypeVar("M", bound=Message)


class FramedFileError(ValueError):
    """A framed file (records, envelopes) is missing, truncated, corrupt, or from a newer format."""


class RecordFileError(FramedFileError):
    """A records file is missing, truncated, corrupt, or from a newer format."""


@dataclass(frozen=True)
class Framing(Generic[M]):
    """A kind of framed file: its header, name suffix, message type, and error to raise."""

    kind: str
    magic: bytes
    suffix: str
    message_type: type[M]
    error: type[FramedFileError]


RECORDS = Framing("records", MAGIC, SUFFIX, ActivationRecord, RecordFileError)


def _varint(data: bytes, offset: int) -> tuple[int, int]:
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
    """The messages of a framed file's bytes, each with its byte offset (``name``: in errors)."""
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
    """The files ``path`` names: a glob's matches, a directory's ``*SUFFIX`` at any depth, or it."""
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


def by_key(records: Iterable[ActivationRecord]) -> dict[bytes, list[ActivationRecord]]:
    """Records grouped by key (keys sorted), each key's in commit order, duplicates dropped.

    Runs of different namespaces on one seq stay apart, one after the other.
    """
    grouped: dict[bytes, dict[tuple[int, str, int], ActivationRecord]] = {}
    for record in records:
        order = (record.seq, record.intent_namespace, record.trace_sequence)
        grouped.setdefault(record.entity_key, {}).setdefault(order, record)
    return {key: [runs[at] for at in sorted(runs)] for key, runs in sorted(grouped.items())}


# -- envelope files -----------------------------------------------------------------------
ENVELOPES_MAGIC = b"BEAM-AGENTS-ENVELOPES/1\n"
ENVELOPES_SUFFIX = ".envelopes"


class EnvelopeFileError(FramedFileError):
    """An envelope file is missing, truncated or corrupt, or holds an envelope with no key."""


ENVELOPES = Framing(
    "envelopes", ENVELOPES_MAGIC, ENVELOPES_SUFFIX, AgentEnvelope, EnvelopeFileError
)


def encode_envelopes(envelopes: Iterable[AgentEnvelope]) -> bytes:
    """An envelope file holding ``envelopes``, in order."""
    return ENVELOPES_MAGIC + b"".join(frame(envelope) for envelope in envelopes)


def write_envelopes(path: str, envelopes: Iterable[AgentEnvelope]) -> None:
    """Write ``envelopes`` to the envelope file ``path`` (name it ``*.envelopes``)."""
    with FileSystems.create(path) as handle:
        handle.write(encode_envelopes(envelopes))


class WriteEnvelopes(WriteFramed):
    """Write ``AgentEnvelope``s to ``path`` (a directory), one envelope file per shard.

    To keep what a ``RunAgent`` receives: ``keyed | beam.Values() | WriteEnvelopes(path)``.
    """

    MAGIC = ENVELOPES_MAGIC
    PREFIX = "envelopes"
    SUFFIX = ENVELOPES_SUFFIX


def read_envelope_file(name: str) -> list[tuple[int, AgentEnvelope]]:
    """The envelopes of the envelope file ``name``, each with its byte offset."""
    envelopes = parse_framed(read_bytes(name, EnvelopeFileError), name, ENVELOPES)
    for start, envelope in envelopes:
        if not envelope.entity_key or envelope.WhichOneof("payload") is None:
            raise EnvelopeFileError(
                f"{name} has an envelope at byte {start} with no entity_key or no payload"
            )
    return envelopes


def envelope_files(paths: Sequence[str]) -> list[str]:
    """The envelope files ``paths`` name (files, directories, globs), each read and checked."""
    files = expand(paths, ENVELOPES)
    for name in files:
        read_envelope_file(name)
    return files


# -- records stored in the effector -------------------------------------------------------
PAGE_RUNS = 500  # runs asked for per ListRecords call
TIMEOUT_S = 30.0


def connect(
    target: str, token_env: str | None = None, tls_root_cert: str | None = None
) -> EffectorConnection:
    """The connection the command line describes (``BadInput`` if it cannot be made)."""
    try:
        return EffectorConnection(target, token_env=token_env, tls_root_cert=tls_root_cert)
    except ValueError as problem:
        raise BadInput(f"--effector {target}: {problem}") from None


def read_stored(
    connection: EffectorConnection, key: bytes, namespace: str | None = None
) -> list[ActivationRecord]:
    """Every record the effector holds for ``key`` (only ``namespace``'s, if given), in order."""
    pages: list[list[ActivationRecord]] = []
    try:
        metadata = connection.metadata()
        with connection.open_channel() as channel:
            stub = connection.stub(channel)
            request = ListRecordsRequest(entity_key=key, max_runs=PAGE_RUNS)
            if namespace is not None:
                request.intent_namespace = namespace
            while True:
                page = stub.ListRecords(request, metadata=metadata, timeout=TIMEOUT_S)
                pages.append(list(page.records))
                if not page.HasField("next_before") or not page.records:
                    break
                request.before.CopyFrom(page.next_before)
    except grpc.RpcError as error:
        code, details = error.code(), error.details()
        raise BadInput(
            f"cannot read records from the effector at {connection.target}: "
            f"{code.name if code else 'UNKNOWN'}: {details}"
        ) from None
    except ValueError as problem:  # the token's environment variable is not set
        raise BadInput(str(problem)) from None
    records = [record for page in reversed(pages) for record in page]
    for record in records:
        check_readable(record, f"the effector at {connection.target} has a record")
    return records
