"""Temporary alias (issue 41): effector.identities moved to effector.service."""
import sys
from effector import service as _moved
sys.modules[__name__] = _moved
