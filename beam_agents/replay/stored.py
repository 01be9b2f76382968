"""Records stored in the effector (``WriteRecordsToEffector``), read back for ``replay``.

:func:`read_stored` pages through one key's records with the effector's ``ListRecords`` RPC,
newest runs first, and returns them in commit order. Any failure (an unreachable effector, a
wrong token, a bad target) is a :class:`~beam_agents.replay.loading.BadInput`, one line.
"""

from __future__ import annotations

import grpc

from beam_agents._protos import ActivationRecord, ListRecordsRequest
from beam_agents.io.connection import EffectorConnection
from beam_agents.replay.loading import BadInput
from beam_agents.replay.recordfile import check_readable

PAGE_RUNS = 500
"""Runs asked for per ``ListRecords`` call (the effector may send fewer)."""
TIMEOUT_S = 30.0


def connect(
    target: str, token_env: str | None = None, tls_root_cert: str | None = None
) -> EffectorConnection:
    """The connection the command line describes (``BadInput`` if it cannot be made)."""
    try:
        return EffectorConnection(target, token_env=token_env, tls_root_cert=tls_root_cert)
    except ValueError as problem:
        raise BadInput(f"--effector {target}: {problem}") from None


def read_stored(connection: EffectorConnection, key: bytes) -> list[ActivationRecord]:
    """Every record the effector holds for ``key``, in commit order."""
    pages: list[list[ActivationRecord]] = []
    try:
        metadata = connection.metadata()
        with connection.open_channel() as channel:
            stub = connection.stub(channel)
            before = 0
            while True:
                request = ListRecordsRequest(entity_key=key, max_runs=PAGE_RUNS, before_seq=before)
                page = stub.ListRecords(request, metadata=metadata, timeout=TIMEOUT_S)
                pages.append(list(page.records))
                before = page.next_before_seq
                if not before:
                    break
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
