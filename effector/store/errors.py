"""The effector's typed errors: configuration, stores and (in the worker) tool execution."""

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
