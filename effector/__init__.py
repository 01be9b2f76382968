"""The effector: a gRPC sidecar that executes each side-effecting intent once.

Agents stage ``ToolIntent`` messages; the pipeline submits them here, and the effector records
each one, executes it with ``EffectorToolRunner``, and publishes its ``ToolResult`` on an ordered
envelope log the pipeline reads back. It never imports Apache Beam. Run it with
``beam-agents-effector serve``; its guarantees, phases, store and settings are described in
``docs/effector.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from effector.worker import EffectorToolRunner

__all__ = ["EffectorToolRunner"]


def __getattr__(name: str) -> Any:
    # Lazy, so that ``import effector`` (and the CLI's --help) stays cheap.
    if name == "EffectorToolRunner":
        from effector.worker import EffectorToolRunner

        return EffectorToolRunner
    raise AttributeError(f"module 'effector' has no attribute {name!r}")
