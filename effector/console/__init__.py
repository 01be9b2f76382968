"""The effector's web console and operator MCP endpoint: the ``[console]`` extra.

Only :mod:`effector.launch` imports this package: it binds both for ``--console-listen`` and
``--mcp-listen``. Actions go through the same service code as the gRPC ``Decide`` and ``Publish``.
"""

from effector.console.app import create_app
from effector.console.serve import ConsoleServer

__all__ = ["ConsoleServer", "create_app"]
