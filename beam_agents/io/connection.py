"""How the pipeline reaches an effector: target, bearer token and TLS, mirroring its server flags."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from beam_agents._protos import EffectorStub

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


def is_transient(error: grpc.RpcError) -> bool:
    """Whether a failed call may succeed if simply tried again."""
    code = error.code() if callable(getattr(error, "code", None)) else None
    return code in _TRANSIENT_CODES


@dataclass(frozen=True)
class EffectorConnection:
    """Connection settings for an effector; picklable, so Beam can ship it to workers.

    ``token`` (or the environment variable named by ``token_env``, read on the worker so the
    secret never enters the pipeline graph) is sent as ``authorization: Bearer <token>`` on every
    call. ``tls_root_cert`` is a PEM file path; when given, the channel uses TLS and verifies the
    server against it. ``tls_server_name`` overrides the name checked in the certificate.
    """

    target: str
    token: str | None = None
    token_env: str | None = None
    tls_root_cert: str | None = None
    tls_server_name: str | None = None

    def __post_init__(self) -> None:
        if not self.target or ":" not in self.target:
            raise ValueError(f"effector target must be HOST:PORT, got {self.target!r}")
        if self.token is not None and self.token_env is not None:
            raise ValueError("give either token or token_env, not both")

    def __repr__(self) -> str:
        token = "<set>" if self.token else None
        return (
            f"EffectorConnection(target={self.target!r}, token={token}, "
            f"token_env={self.token_env!r}, tls_root_cert={self.tls_root_cert!r})"
        )

    def resolved_token(self) -> str | None:
        """The bearer token to send, read from the environment when ``token_env`` is set."""
        if self.token_env is not None:
            value = os.environ.get(self.token_env)
            if not value:
                raise ValueError(f"environment variable {self.token_env} is not set")
            return value
        return self.token

    def metadata(self) -> tuple[tuple[str, str], ...]:
        """Call metadata carrying the bearer token, if any."""
        token = self.resolved_token()
        return (("authorization", f"Bearer {token}"),) if token else ()

    def open_channel(self) -> grpc.Channel:
        """A new synchronous channel to the effector."""
        options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
        if self.tls_server_name:
            options.append(("grpc.ssl_target_name_override", self.tls_server_name))
        if self.tls_root_cert is None:
            return grpc.insecure_channel(self.target, options=options)
        credentials = grpc.ssl_channel_credentials(Path(self.tls_root_cert).read_bytes())
        return grpc.secure_channel(self.target, credentials, options=options)

    def stub(self, channel: grpc.Channel) -> EffectorStub:
        """The generated stub over ``channel``."""
        return EffectorStub(channel)
