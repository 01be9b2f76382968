"""Network addresses: ``HOST:PORT`` text, and which hosts are loopback.

Shared by the server (its gRPC, metrics and console addresses), the command line and the
console's DNS-rebinding guard, which must not import the server.
"""

from __future__ import annotations

import ipaddress

from effector.errors import ConfigurationError


def parse_host_port(text: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[::1]:PORT`` for IPv6); port 0 means any free port."""
    host, separator, port_text = text.rpartition(":")
    if not separator or not host or not port_text.isdigit():
        raise ConfigurationError(f"expected HOST:PORT, got {text!r}")
    port = int(port_text)
    if port > 65_535:
        raise ConfigurationError(f"port {port} is out of range in {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def format_host_port(host: str, port: int) -> str:
    """Join a host and port the way gRPC targets spell them (IPv6 in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (IPv6 bare or in brackets).

    Any other name counts as non-loopback, whatever it resolves to.
    """
    if host.lower() == "localhost":
        return True
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
