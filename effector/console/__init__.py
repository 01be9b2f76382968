"""The effector's web console: overview, keys and their runs, intents, approvals, errors.

``beam-agents-effector serve --console-listen HOST:PORT`` serves it from the effector process
(:class:`~effector.server.EffectorServer` starts and stops it). Pages are rendered on the
server from the store; approving, denying and re-driving go through the same service code as
the gRPC ``Decide`` and ``Publish``, behind the effector's token. ``docs/effector.md`` tells more.
"""

from effector.console.app import create_app
from effector.console.serve import ConsoleServer

__all__ = ["ConsoleServer", "create_app"]
