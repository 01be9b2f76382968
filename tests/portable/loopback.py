"""Run a Python module as ``__main__`` with every gRPC server it starts bound to 127.0.0.1.

Beam's job service and worker pool listen on ``[::]`` with no option to change it; tests listen
on loopback only. Usage: ``python -m tests.portable.loopback MODULE ARGS...``.
"""

from __future__ import annotations

import runpy
import sys
from typing import Any

from grpc import _server

_ANY_HOSTS = ("[::]:", "0.0.0.0:", "localhost:")
_original = _server._Server.add_insecure_port


def _on_loopback(self: Any, address: str) -> int:
    for host in _ANY_HOSTS:
        if address.startswith(host):
            address = "127.0.0.1:" + address[len(host) :]
    return int(_original(self, address))


if __name__ == "__main__":
    _server._Server.add_insecure_port = _on_loopback  # type: ignore[method-assign]
    module, *arguments = sys.argv[1:]
    sys.argv = [module, *arguments]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
