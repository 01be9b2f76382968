"""Temporary alias (issue 41): effector.runner moved to effector.worker."""
import sys
from effector import worker as _moved
sys.modules[__name__] = _moved
