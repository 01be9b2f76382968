"""Fixtures for the replay tests: the io tests' real effector on 127.0.0.1 and its ledger.

The backtest tests record through a running effector (results come back and resume runs) and
then check that its ledger and store show nothing new.
"""

from __future__ import annotations

from tests.io.conftest import effector, ledger, store_url

__all__ = ["effector", "ledger", "store_url"]
