"""Typed errors raised by the effector: configuration, stores and tool execution.

Each is an :class:`EffectorError`; the command line reports the configuration and store ones.
"""

from __future__ import annotations


class EffectorError(Exception):
    """Base class of every error the effector raises on purpose."""


class ConfigurationError(EffectorError):
    """The effector was configured wrongly (a flag, a URL, a file); the message says which."""


class StoreError(EffectorError):
    """A store could not carry out an operation (unreachable database, corrupt file, ...)."""


class StoreBusyError(StoreError):
    """The store is already in exclusive use by another effector process."""


class StoreSchemaError(StoreError):
    """The store holds a schema version this effector does not understand."""


class ToolRefusedError(EffectorError):
    """The effector refused to run a tool at all (it is read-only, or lacks what it needs)."""


class ToolTimeoutError(EffectorError, TimeoutError):
    """A tool did not finish within the effector's per-call timeout."""
