# mypy: disallow-untyped-calls=False
# (Beam's filesystem API is unannotated.)
"""Envelope files: the input of ``beam-agents backtest --envelopes``, with no recording behind.

An envelope file has the records files' framing (``io/records.py``): the header
:data:`ENVELOPES_MAGIC`, then each ``AgentEnvelope`` as a base-128 varint of its length and its
deterministic serialization. :func:`write_envelopes` writes one file (from a script or a test);
:class:`WriteEnvelopes` writes them from a pipeline, one per shard, as ``WriteRecords`` does.
:func:`envelope_files` finds and checks the files that paths, directories (their
``*.envelopes``) or globs name; :func:`read_envelope_file` reads one back, each envelope with
its byte offset, so that a key's envelopes keep their order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from apache_beam.io.filesystems import FileSystems

from beam_agents._protos import AgentEnvelope
from beam_agents.io.records import WriteFramed, frame
from beam_agents.replay.recordfile import FramedFileError, Framing, expand, parse_framed, read_bytes

__all__ = [
    "ENVELOPES",
    "ENVELOPES_MAGIC",
    "ENVELOPES_SUFFIX",
    "EnvelopeFileError",
    "WriteEnvelopes",
    "encode_envelopes",
    "envelope_files",
    "parse_envelopes",
    "read_envelope_file",
    "write_envelopes",
]

ENVELOPES_MAGIC = b"BEAM-AGENTS-ENVELOPES/1\n"
"""The first bytes of every envelope file (format version 1)."""

ENVELOPES_SUFFIX = ".envelopes"
"""The file name suffix of envelope files; a directory is read as its ``*.envelopes`` files."""


class EnvelopeFileError(FramedFileError):
    """An envelope file is missing, truncated or corrupt, or holds an envelope with no key."""


ENVELOPES = Framing(
    "envelopes", ENVELOPES_MAGIC, ENVELOPES_SUFFIX, AgentEnvelope, EnvelopeFileError
)


def encode_envelopes(envelopes: Iterable[AgentEnvelope]) -> bytes:
    """An envelope file holding ``envelopes``, in order."""
    return ENVELOPES_MAGIC + b"".join(frame(envelope) for envelope in envelopes)


def write_envelopes(path: str, envelopes: Iterable[AgentEnvelope]) -> None:
    """Write ``envelopes`` to the envelope file ``path`` (local or any Beam filesystem).

    Name it ``*.envelopes`` so that a directory of such files is read whole.
    """
    with FileSystems.create(path) as handle:
        handle.write(encode_envelopes(envelopes))


class WriteEnvelopes(WriteFramed):
    """Write ``AgentEnvelope``s to ``path`` (a directory), one envelope file per shard.

    Files are named ``envelopes-SSSSS-of-NNNNN.envelopes``; unbounded input is windowed as
    ``WriteRecords`` windows it. To keep what a pipeline's ``RunAgent`` receives, write the
    envelopes of its input: ``keyed | beam.Values() | WriteEnvelopes(path)``.
    """

    MAGIC = ENVELOPES_MAGIC
    PREFIX = "envelopes"
    SUFFIX = ENVELOPES_SUFFIX


def parse_envelopes(data: bytes, name: str = "<envelopes>") -> list[tuple[int, AgentEnvelope]]:
    """The envelopes in the bytes of one envelope file, each with its byte offset."""
    envelopes = parse_framed(data, name, ENVELOPES)
    for start, envelope in envelopes:
        if not envelope.entity_key or envelope.WhichOneof("payload") is None:
            raise EnvelopeFileError(
                f"{name} has an envelope at byte {start} with no entity_key or no payload"
            )
    return envelopes


def read_envelope_file(name: str) -> list[tuple[int, AgentEnvelope]]:
    """The envelopes of the envelope file ``name``, each with its byte offset."""
    return parse_envelopes(read_bytes(name, EnvelopeFileError), name)


def envelope_files(paths: Sequence[str]) -> list[str]:
    """The envelope files ``paths`` name (files, directories, globs), each read and checked.

    Raises :class:`EnvelopeFileError` for a path that names none, or a file that is not a
    whole, valid envelope file, so that bad input is refused before a pipeline starts.
    """
    files = expand(paths, ENVELOPES)
    for name in files:
        read_envelope_file(name)
    return files
