"""Temporary alias (issue 41): effector.intents moved to effector.store.model."""
import sys
from effector.store import model as _moved
sys.modules[__name__] = _moved
