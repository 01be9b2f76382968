"""Temporary alias (issue 41): effector.intents moved to effector.store.intents."""
import sys
from effector.store import intents as _moved
sys.modules[__name__] = _moved
