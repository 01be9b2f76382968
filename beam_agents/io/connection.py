"""How the pipeline reaches an effector: target, bearer token and TLS, mirroring its server flags.

:class:`EffectorConnection` is the client half of the effector's ``--token`` and
``--tls-cert`` settings; its target may list several replicas of one effector, which calls
reach round-robin. See ``beam_agents/io/README.md``.
"""

from __future__ import annotations

import ipaddress
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from beam_agents._protos import EffectorStub

_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""The largest message the effector accepts or sends by default (its ``MAX_MESSAGE_BYTES``)."""

_CHANNEL_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
    # gRPC's reconnect backoff grows to two minutes by default; a restarted effector should be
    # found within the retry budget of SubmitIntents and the read loop of ReadEnvelopes.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
)

_ROUND_ROBIN = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})
"""gRPC service config spreading calls over every address of a replica list."""

_TRANSIENT_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNKNOWN,
    }
)
_AUTH_CODES = frozenset({grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED})


def _status_code(error: grpc.RpcError) -> grpc.StatusCode | None:
    code = getattr(error, "code", None)
    return code() if callable(code) else None


def _is_transient(error: grpc.RpcError) -> bool:
    """Whether a failed call may succeed if simply tried again."""
    return _status_code(error) in _TRANSIENT_CODES


def _describe(error: grpc.RpcError) -> str:
    """``CODE: details`` of a failed call, for dead letters and error messages."""
    code = _status_code(error)
    details = getattr(error, "details", None)
    text = details() if callable(details) else str(error)
    return f"{code.name if code is not None else 'UNKNOWN'}: {text}"


def _call_failure(what: str, target: str, error: grpc.RpcError) -> Exception:
    """The exception to raise for a call that failed for good: typed by its cause."""
    message = f"{what} at {target} failed: {_describe(error)}"
    if _status_code(error) in _AUTH_CODES:
        return PermissionError(f"{message} (check the token)")
    if _is_transient(error):
        return ConnectionError(message)
    return RuntimeError(message)


@dataclass(frozen=True)
class EffectorConnection:
    """Connection settings for an effector; picklable, so Beam can ship it to workers.

    - ``target``: ``HOST:PORT`` (or any gRPC target) of the effector; or the replicas of one
      effector as a comma-separated list of ``IP:PORT`` addresses (``[IPv6]:PORT``), e.g.
      ``"127.0.0.1:50051,127.0.0.1:50052"``, reached round-robin (see ``beam_agents/io/README.md``).
    - ``token`` (or the environment variable named by ``token_env``, read on the worker so
      that the secret never enters the pipeline graph) is sent as
      ``authorization: Bearer <token>`` on every call, as the effector's ``--token`` expects.
    - ``tls_root_cert``: the PEM root certificate (a file path, or the PEM bytes) that the
      effector's ``--tls-cert`` must chain to; with it the channel uses TLS. A path is read
      when the connection is created, so a missing file is reported at once.
    - ``tls_server_name``: the name to check in the server's certificate instead of the
      target's host (for test certificates issued to another name).
    """

    target: str
    token: str | None = field(default=None, repr=False)
    token_env: str | None = None
    tls_root_cert: str | os.PathLike[str] | bytes | None = field(default=None, repr=False)
    tls_server_name: str | None = None
    _root_certificates: bytes | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.target, str) or ":" not in self.target:
            raise ValueError(f"effector target must be HOST:PORT, got {self.target!r}")
        _channel_target(self.target)
        if self.token is not None and self.token_env is not None:
            raise ValueError("give either token or token_env, not both")
        if self.token is not None and not self.token.strip():
            raise ValueError("token is empty")
        if self.tls_server_name is not None and self.tls_root_cert is None:
            raise ValueError("tls_server_name needs tls_root_cert (it only applies to TLS)")
        object.__setattr__(self, "_root_certificates", _read_root_certificates(self.tls_root_cert))

    def resolved_token(self) -> str | None:
        """The bearer token to send, read from the environment when ``token_env`` is set."""
        if self.token_env is not None:
            value = os.environ.get(self.token_env, "").strip()
            if not value:
                raise ValueError(
                    f"environment variable {self.token_env} (the effector token) is not set"
                )
            return value
        return self.token

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata carrying the bearer token, if any."""
        token = self.resolved_token()
        return (("authorization", f"Bearer {token}"),) if token else ()

    def open_channel(self) -> grpc.Channel:
        """A new synchronous channel to the effector; the caller closes it."""
        options: list[tuple[str, str | int]] = list(_CHANNEL_OPTIONS)
        target = _channel_target(self.target)
        if target != self.target:
            options.append(("grpc.service_config", _ROUND_ROBIN))
        if self._root_certificates is None:
            return grpc.insecure_channel(target, options=options)
        if self.tls_server_name:
            options.append(("grpc.ssl_target_name_override", self.tls_server_name))
        credentials = grpc.ssl_channel_credentials(root_certificates=self._root_certificates)
        return grpc.secure_channel(target, credentials, options=options)

    def stub(self, channel: grpc.Channel) -> EffectorStub:
        """The generated ``Effector`` stub over ``channel``."""
        return EffectorStub(channel)  # type: ignore[no-untyped-call]


def _channel_target(target: str) -> str:
    """The gRPC target for ``target``: itself, or for a list of replicas an address list.

    gRPC spells a fixed list of addresses ``ipv4:A:P,B:P`` (or ``ipv6:[A]:P,[B]:P``); it has no
    such form for host names, so a list must give IP addresses of one family.
    """
    if "," not in target:
        return target
    families: set[int] = set()
    for address in target.split(","):
        host, separator, port = address.strip().rpartition(":")
        bracketed = host.startswith("[") and host.endswith("]")
        try:
            version = ipaddress.ip_address(host[1:-1] if bracketed else host).version
        except ValueError:
            raise ValueError(
                f"a list of effector replicas must give IP:PORT addresses, got {address!r} in "
                f"{target!r} (for host names, use one DNS name that resolves to every replica)"
            ) from None
        if not separator or not port.isdigit() or (version == 6) != bracketed:
            raise ValueError(
                f"effector replica {address!r} in {target!r} is not IP:PORT ([IPv6]:PORT)"
            )
        families.add(version)
    if len(families) > 1:
        raise ValueError(f"effector replicas {target!r} mix IPv4 and IPv6 addresses")
    addresses = ",".join(address.strip() for address in target.split(","))
    return f"ipv{families.pop()}:{addresses}"


def _read_root_certificates(source: str | os.PathLike[str] | bytes | None) -> bytes | None:
    if source is None or isinstance(source, bytes):
        return source
    try:
        return Path(source).read_bytes()
    except OSError as exc:
        raise ValueError(
            f"cannot read tls_root_cert {os.fspath(source)!r}: {exc.strerror}"
        ) from None


def _connection(
    target: str | EffectorConnection,
    token: str | None,
    token_env: str | None,
    tls_root_cert: str | os.PathLike[str] | bytes | None,
) -> EffectorConnection:
    """The connection a transform was given, or one built from its keyword arguments."""
    if isinstance(target, EffectorConnection):
        if token is not None or token_env is not None or tls_root_cert is not None:
            raise ValueError(
                "pass token, token_env and tls_root_cert inside the EffectorConnection, "
                "not beside it"
            )
        return target
    return EffectorConnection(target, token=token, token_env=token_env, tls_root_cert=tls_root_cert)
