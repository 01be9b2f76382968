"""Temporary alias (issue 41): effector.audit moved to effector.observability."""
import sys
from effector import observability as _moved
sys.modules[__name__] = _moved
