"""Loading what the command line names: agents, config factories, keys and price tables.

``module:function`` is imported the way ``python -m`` would (the working directory first on the
path). Every problem is a :class:`BadInput` with a one-line message, which the command prints
and exits 2 on.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from beam_agents.core.agent import AgentFn, is_agent
from beam_agents.core.config import AgentConfig
from beam_agents.replay.report import Price, parse_prices


class BadInput(ValueError):
    """Input the command cannot use: it exits 2 with this one-line message."""


def load_object(spec: str, what: str) -> Any:
    """The object ``module:attribute`` names (``what`` names it in errors)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise BadInput(f"{what} must be given as module:attribute, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as problem:  # the user's module may fail in any way
        raise BadInput(f"cannot import {what} module {module_name!r}: {problem}") from None
    try:
        found = module
        for part in attribute.split("."):
            found = getattr(found, part)
    except AttributeError:
        raise BadInput(f"{what} {spec!r}: module {module_name!r} has no {attribute!r}") from None
    return found


def load_agent(spec: str) -> AgentFn:
    """The agent ``module:function`` names: an ``async def agent(ctx)``."""
    agent = load_object(spec, "agent")
    if not is_agent(agent):
        raise BadInput(f"agent {spec!r} is not an `async def agent(ctx)` function")
    return agent  # type: ignore[no-any-return]


def load_config(spec: str | None) -> AgentConfig:
    """The ``AgentConfig`` the zero-argument factory ``module:function`` returns (default one)."""
    if spec is None:
        return AgentConfig()
    factory: Callable[[], object] = load_object(spec, "config factory")
    if not callable(factory):
        raise BadInput(f"config factory {spec!r} is not callable")
    try:
        config = factory()
    except Exception as problem:  # the user's factory may fail in any way
        raise BadInput(f"config factory {spec!r} failed: {problem}") from None
    if not isinstance(config, AgentConfig):
        raise BadInput(f"config factory {spec!r} returned {type(config).__name__}, not AgentConfig")
    return config


def make_provider(config: AgentConfig) -> object | None:
    """The model client ``config.provider_factory`` makes (``None`` without one)."""
    if config.provider_factory is None:
        return None
    try:
        return config.provider_factory()
    except Exception as problem:  # the user's factory may fail in any way
        raise BadInput(f"the config's provider_factory failed: {problem}") from None


def parse_key(text: str) -> bytes:
    """A key as given on the command line: UTF-8 text, or ``hex:`` and its bytes in hex."""
    if text.startswith("hex:"):
        try:
            return bytes.fromhex(text[4:])
        except ValueError:
            raise BadInput(f"--key {text!r} is not valid hex") from None
    return text.encode("utf-8")


def load_prices(path: str | None) -> dict[str, Price]:
    """The price table in the JSON file ``path`` (none: no prices)."""
    if path is None:
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            return parse_prices(json.load(handle))
    except (OSError, ValueError) as problem:
        raise BadInput(f"--prices {path}: {problem}") from None
