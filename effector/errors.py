"""Temporary alias (issue 41): effector.errors moved to effector.store.errors."""
import sys
from effector.store import errors as _moved
sys.modules[__name__] = _moved
