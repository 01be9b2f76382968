"""The effector: a gRPC sidecar that executes each side-effecting intent once.

The pipeline submits ``ToolIntent`` messages; the effector records and executes each, and
publishes its ``ToolResult`` on an ordered envelope log the pipeline reads back.
"""

from __future__ import annotations

import importlib
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


_HOMES = {
    "EffectorClient": "effector.client",
    "EffectorProcess": "effector.launch",
    "EffectorThread": "effector.launch",
    "EffectorToolRunner": "effector.worker",
    "ServerSettings": "effector.server",
    "WorkerSettings": "effector.worker",
    "child_environment": "effector.launch",
}


def __getattr__(name: str) -> Any:
    # Lazy, so that ``import effector`` (and the CLI's --help) stays cheap.
    if name not in _HOMES:
        raise AttributeError(f"module 'effector' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)
