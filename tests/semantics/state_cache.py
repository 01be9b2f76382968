"""Beam's state cache weighing its values without first walking every loaded module.

The local runner's state cache sizes every value it is given or loads with
``apache_beam.runners.worker.statecache.get_deep_size`` (``objsize``), which, on every call,
first collects the globals of every module in ``sys.modules`` so as not to count them. Under
pytest, with the whole suite's imports loaded, that walk alone takes about a millisecond and is
paid per state cell, key and bundle: most of the time of a pipeline that runs thousands of
activations (the crash and replica gates spent well over half their time in it).

:func:`module_walk_free_weights` swaps in the same measurement (Beam's own size, referents and
filter functions) that leaves out a module's globals when the traversal reaches them, instead of
collecting them all up front: the same weights, so the cache keeps and evicts exactly as before;
``test_state_cache.py`` checks that the two agree.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import objsize  # type: ignore[import-untyped]
import pytest
from apache_beam.runners.worker import statecache

beams_weight = statecache.get_deep_size
"""Beam's own weigher, walk included (kept before any patch, for the check against it)."""


def _is_module_globals(obj: object) -> bool:
    """Whether ``obj`` is the globals of a loaded module (objsize excludes those)."""
    if type(obj) is not dict:
        return False
    name = obj.get("__name__")
    module = sys.modules.get(name) if isinstance(name, str) else None
    return module is not None and getattr(module, "__dict__", None) is obj


def _measured(obj: object) -> bool:
    return bool(statecache._filter_func(obj)) and not _is_module_globals(obj)


def weigh(*values: Any) -> int:
    """``statecache.get_deep_size(*values)``, without the walk over every module's globals."""
    return int(
        objsize.get_deep_size(
            *values,
            get_size_func=statecache._size_func,
            get_referents_func=statecache._get_referents_func,
            filter_func=_measured,
            exclude_modules_globals=False,
        )
    )


@contextmanager
def module_walk_free_weights() -> Iterator[None]:
    """Beam's state cache weighs with :func:`weigh` inside the block."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(statecache, "get_deep_size", weigh)
        yield


@pytest.fixture(scope="module", autouse=True)
def module_walk_free_state_cache() -> Iterator[None]:
    """Every pipeline of a test module (module-scoped set-ups included) weighs with :func:`weigh`.

    Imported by the conftests of the suites that run long pipelines; module-scoped, so the
    patch ends with the module and reaches no other suite.
    """
    with module_walk_free_weights():
        yield
