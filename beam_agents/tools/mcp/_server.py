"""``McpServer``: where an MCP server is and how to reach it (stdio or streamable HTTP)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

DEFAULT_CALL_TIMEOUT_S = 30.0
"""How long one inline ``tools/call`` may take unless the server says otherwise."""

DEFAULT_CONNECT_TIMEOUT_S = 10.0
"""How long connecting (spawning or reaching the server, and the handshake) may take."""


@dataclass(frozen=True)
class McpServer:
    """An MCP server description; hashable, picklable, and the key of its process-wide session.

    Build one with :meth:`stdio` or :meth:`http`. The repr shows no environment values or
    header values, which often hold credentials.
    """

    transport: Literal["stdio", "http"]
    command: str = ""
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    url: str = ""
    headers: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        *,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    ) -> McpServer:
        """A server run as ``command args`` and spoken to over its stdin and stdout.

        ``env`` is added to a minimal default environment (the MCP SDK's), not to this
        process's, so secrets of the pipeline do not leak to the server by accident.
        """
        if not isinstance(command, str) or not command:
            raise ValueError(f"McpServer.stdio needs a command, got {command!r}")
        if isinstance(args, str):
            raise TypeError("McpServer.stdio args is a sequence of strings, not one string")
        return cls(
            "stdio",
            command=command,
            args=tuple(str(arg) for arg in args),
            env=_pairs(env, "env"),
            call_timeout_s=_positive(call_timeout_s, "call_timeout_s"),
            connect_timeout_s=_positive(connect_timeout_s, "connect_timeout_s"),
        )

    @classmethod
    def http(
        cls,
        url: str,
        headers: Mapping[str, str] | None = None,
        *,
        call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    ) -> McpServer:
        """A server at ``url`` over streamable HTTP, sent ``headers`` (say, authorization)."""
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"McpServer.http needs an http:// or https:// URL, got {url!r}")
        return cls(
            "http",
            url=url,
            headers=_pairs(headers, "headers"),
            call_timeout_s=_positive(call_timeout_s, "call_timeout_s"),
            connect_timeout_s=_positive(connect_timeout_s, "connect_timeout_s"),
        )

    @property
    def label(self) -> str:
        """How messages name the server: its URL, or its command line."""
        if self.transport == "http":
            return self.url
        return " ".join((self.command, *self.args))


def _pairs(mapping: Mapping[str, str] | None, what: str) -> tuple[tuple[str, str], ...]:
    if mapping is None:
        return ()
    if not isinstance(mapping, Mapping):
        raise TypeError(f"McpServer {what} must be a mapping of str to str")
    for key, value in mapping.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"McpServer {what} must map str to str, got {key!r}: {value!r}")
    return tuple(sorted(mapping.items()))


def _positive(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"McpServer {what} must be a positive number of seconds, got {value!r}")
    return float(value)
