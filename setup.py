"""The optional compiled build: ``BEAM_AGENTS_COMPILE=1`` compiles the runtime core with mypyc.

Everything else is in ``pyproject.toml``; without the variable the install is pure Python.
"""

from __future__ import annotations

import os

from setuptools import Extension, setup

COMPILED_MODULES = (
    "beam_agents/core/activation.py",
    "beam_agents/core/model_calls.py",
    "beam_agents/core/observability.py",
    "beam_agents/core/staging.py",
    "beam_agents/core/state.py",
)
"""The activation machine and what it calls per element: no class here is called by agents."""


def compiled_extensions() -> list[Extension]:
    """The core's extension modules when ``BEAM_AGENTS_COMPILE=1``, else none."""
    if os.environ.get("BEAM_AGENTS_COMPILE") != "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError as missing:
        raise SystemExit(
            "BEAM_AGENTS_COMPILE=1 needs mypyc in the build environment: install mypy and "
            "build with --no-build-isolation"
        ) from missing
    return list(mypycify(list(COMPILED_MODULES), opt_level="3", group_name="beam_agents_core"))


setup(ext_modules=compiled_extensions())
