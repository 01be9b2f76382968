"""The effector: a gRPC sidecar that executes each side-effecting intent once.

The pipeline submits ``ToolIntent`` messages; the effector records and executes each, and
publishes its ``ToolResult`` on an ordered envelope log the pipeline reads back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from effector.client import EffectorClient
    from effector.launch import EffectorProcess, EffectorThread, child_environment
    from effector.server import ServerSettings
    from effector.worker import EffectorToolRunner, WorkerSettings

__all__ = [
    "EffectorClient",
    "EffectorProcess",
    "EffectorThread",
    "EffectorToolRunner",
    "ServerSettings",
    "WorkerSettings",
    "child_environment",
]


def __getattr__(name: str) -> Any:
    # Lazy, so that ``import effector`` (and the CLI's --help) stays cheap.
    if name == "EffectorClient":
        from effector.client import EffectorClient

        return EffectorClient
    if name in ("EffectorProcess", "EffectorThread", "child_environment"):
        import effector.launch

        return getattr(effector.launch, name)
    if name == "ServerSettings":
        from effector.server import ServerSettings

        return ServerSettings
    if name in ("EffectorToolRunner", "WorkerSettings"):
        import effector.worker

        return getattr(effector.worker, name)
    raise AttributeError(f"module 'effector' has no attribute {name!r}")
