"""Temporary alias (issue 41): effector.store._tx moved to effector.store.schema."""
import sys
from effector.store import schema as _moved
sys.modules[__name__] = _moved
